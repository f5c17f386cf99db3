"""Gradient builders, one module per op family; importing this package registers them all."""

from . import (  # noqa: F401
    activation_grads,
    conv_pool_grads,
    dropout_loss_grads,
    einsum_grads,
    elementwise_grads,
    matmul_grads,
    normalization_grads,
    recurrent_grads,
    reduction_grads,
    resize_grads,
    shape_grads,
)
