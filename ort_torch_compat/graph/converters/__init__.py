"""Our converters, registered on import (see ..converter_registry for the lookup order)."""
from . import (  # noqa: F401
    activations, casting, contrib_fusions, control_flow, conv_transpose, convolution, dropout, elementwise,
    fused, gemm, indexing, data_movement, losses, batch_norm, layer_norm, group_lp_norms, padding, pooling, quantization,
    recurrent, reductions, resize, sampling, sequences, shape, signal, strings, tensor_ops, unsqueeze, vision,
)
