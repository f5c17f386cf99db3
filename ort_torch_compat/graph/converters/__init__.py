"""Our converters, registered on import (see ..registry for the lookup order)."""
from . import (  # noqa: F401
    activations, casting, convolution, dropout, elementwise, fused, gemm, losses, normalization, pooling, recurrent, reductions,
    tensor_ops,
)
