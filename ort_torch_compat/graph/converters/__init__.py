"""Our converters, registered on import (see ..registry for the lookup order)."""
from . import (  # noqa: F401
    activations, casting, contrib_fusions, control_flow, conv_transpose, convolution, dropout, elementwise,
    fused, gemm, indexing, layout, losses, normalization, norms, ort_normalization, padding, pooling, quantization,
    recurrent, reductions, resize, sampling, sequences, signal, strings, tensor_ops, vision,
)
