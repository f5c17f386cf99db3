"""ONNX Runtime 1.19.2's gradients where they are not the derivative of its own forward.

Found by the op coverage suite (scripts/make_op_coverage.py; the gradient column of
docs/op-coverage.md), each checked against float64 finite differences of the forward, which
matches ORT's:

- Dropout (opset 12+) with a `ratio` input while inactive (training_mode absent or False, so
  the forward is the identity): ORT's DropoutGrad still divides by (1 - ratio).  Without a
  ratio input, and for Dropout-7/10, the gradient is the identity as it should be.
- Gelu-20 with approximate="tanh": ORT differentiates the exact (erf) GELU.
- Clip-1/6 (bounds as attributes): the gradient passes through everywhere, clipped or not.
- SoftmaxCrossEntropyLoss: nothing flows back through its log_prob output (reproduced by
  detaching it).
- AveragePool with auto_pad=SAME_LOWER: the gradient of SAME_UPPER pooling (padding at the
  end, pads not counted); with dilations: the gradient of the undilated pooling.
- ScatterElements / ScatterND with a reduction (add, mul, max, min): the gradient of the plain
  scatter, as if the updates replaced the data.

Under ConversionOptions(gradients="ort"), the default of the drop-in API, converters reproduce
these with `ort_gradient(value, surrogate)`: the forward is `value`, the backward is the
derivative of `surrogate`, ORT's gradient written as a function.  gradients="exact" gives the
derivative of the forward.  Two deviations have no formula we could match and are *not*
reproduced (the exact gradient in both modes): Conv with auto_pad=SAME_UPPER/SAME_LOWER and
Where whose data input is broadcast (ORT returns the first elements of the unreduced gradient).
"""

from __future__ import annotations

import torch

from .options import current


def reproduce_ort_gradients() -> bool:
    """Whether the conversion in progress reproduces ORT's gradients (decided per Module)."""
    return current().gradients == "ort"


def ort_gradient(value: torch.Tensor, surrogate: torch.Tensor) -> torch.Tensor:
    """`value` forward, the gradient of `surrogate` backward (same shape)."""
    return value.detach() + (surrogate - surrogate.detach())
