"""Gradient builders, one module per op family; importing this package registers them all."""
from . import activations, conv_pool, dropout_loss, elementwise, matmul, normalization, recurrent, reductions, shape_ops  # noqa: F401
