"""Random generators: torch's RNG draws from the same distributions as ONNX Runtime's, not
the same numbers (ort_torch_compat.set_seed makes them reproducible)."""

from __future__ import annotations

import torch

from ..converter_registry import register
from ._common import OnnxGraph, OnnxModule, OnnxNode, result
from .casting import torch_dtype


class RandomTensor(OnnxModule):
    def __init__(self, kind: str, shape, dtype, a: float, b: float):
        super().__init__()
        self.kind, self.shape, self.dtype, self.a, self.b = kind, shape, dtype, a, b

    def forward(self, like: torch.Tensor = None) -> torch.Tensor:
        shape = list(self.shape) if like is None else list(like.shape)
        dtype = self.dtype or (like.dtype if like is not None else torch.float32)
        device = like.device if like is not None else None
        if self.kind == "normal":
            return torch.randn(shape, dtype=dtype, device=device) * self.b + self.a
        return torch.rand(shape, dtype=dtype, device=device) * (self.b - self.a) + self.a


def _random(kind: str, like: bool):
    def convert(node: OnnxNode, graph: OnnxGraph):
        a = node.attributes
        dtype = torch_dtype(int(a["dtype"])) if "dtype" in a else (None if like else torch.float32)
        if kind == "normal":
            first, second = float(a.get("mean", 0.0)), float(a.get("scale", 1.0))
        else:
            first, second = float(a.get("low", 0.0)), float(a.get("high", 1.0))
        return result(RandomTensor(kind, None if like else a["shape"], dtype, first, second), node)

    return convert


register("RandomNormal", 1)(_random("normal", False))
register("RandomUniform", 1)(_random("uniform", False))
register("RandomNormalLike", 1)(_random("normal", True))
register("RandomUniformLike", 1)(_random("uniform", True))


class Bernoulli(OnnxModule):
    def __init__(self, dtype):
        super().__init__()
        self.dtype = dtype

    def forward(self, probabilities: torch.Tensor) -> torch.Tensor:
        return torch.bernoulli(probabilities).to(self.dtype or probabilities.dtype)


@register("Bernoulli", 15)
def _bernoulli(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    return result(Bernoulli(torch_dtype(int(a["dtype"])) if "dtype" in a else None), node)


class Multinomial(OnnxModule):
    def __init__(self, samples: int, dtype):
        super().__init__()
        self.samples, self.dtype = samples, dtype

    def forward(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.multinomial(torch.softmax(logits, dim=-1), self.samples, replacement=True).to(self.dtype)


@register("Multinomial", 7)
def _multinomial(node: OnnxNode, graph: OnnxGraph):
    a = node.attributes
    return result(Multinomial(int(a.get("sample_size", 1)), torch_dtype(int(a.get("dtype", 6)))), node)
