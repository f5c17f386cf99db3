"""Our converters, registered on import (see ..registry for the lookup order)."""
from . import activations, convolution, dropout, fused, gemm, losses, normalization, pooling, recurrent, reductions, tensor_ops  # noqa: F401
from . import conv_transpose, flatten, ort_normalization, trilu  # noqa: F401  (real-architecture ops)
