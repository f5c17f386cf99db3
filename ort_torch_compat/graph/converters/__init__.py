"""Our converters, registered on import (see ..registry for the lookup order)."""
from . import activations, convolution, dropout, fused, gemm, losses, normalization, pooling, recurrent, reductions, tensor_ops  # noqa: F401
