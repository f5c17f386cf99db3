"""Activations chosen by name inside another op: ONNX's RNN/GRU/LSTM `activations`
attribute and ORT's fused Conv/Gemm `activation` (MLAS activation kinds).  One table, so
both read a name the same way: case-insensitive, with ONNX's defaults for alpha and beta
(Clip: alpha is the lower bound, beta the upper)."""

from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F


def _or(value: Optional[float], default: float) -> float:
    return default if value is None else value


def named_activation(name: str, alpha: Optional[float] = None, beta: Optional[float] = None) -> Callable:
    """The function ONNX (or ORT's fusions) mean by `name`; NotImplementedError for others."""
    key = name.lower()
    if key == "sigmoid":
        return torch.sigmoid
    if key == "tanh":
        return torch.tanh
    if key == "relu":
        return torch.relu
    if key == "leakyrelu":
        return lambda x: F.leaky_relu(x, _or(alpha, 0.01))
    if key == "thresholdedrelu":
        return lambda x: torch.where(x > _or(alpha, 1.0), x, torch.zeros_like(x))
    if key == "scaledtanh":
        return lambda x: _or(alpha, 1.0) * torch.tanh(_or(beta, 1.0) * x)
    if key == "hardsigmoid":
        return lambda x: (_or(alpha, 0.2) * x + _or(beta, 0.5)).clamp(0.0, 1.0)
    if key == "elu":
        return lambda x: F.elu(x, _or(alpha, 1.0))
    if key == "softsign":
        return F.softsign
    if key == "softplus":
        return F.softplus
    if key == "affine":
        return lambda x: _or(alpha, 1.0) * x + _or(beta, 0.0)
    if key == "clip":
        return lambda x: x.clamp(_or(alpha, float("-inf")), _or(beta, float("inf")))
    raise NotImplementedError(f"activation {name!r}")
