"""Drop-in `onnxruntime.training.api.Optimizer`."""

from __future__ import annotations

import os
from typing import Union

from ..engine import OptimizerEngine
from .module import Module


class Optimizer:
    """Updates the module's trainable parameters as the optimizer artifact prescribes
    (AdamWOptimizer in either adam_mode, or SGDOptimizerV2)."""

    def __init__(self, optimizer_uri: Union[str, os.PathLike, bytes], module: Module):
        source = optimizer_uri if isinstance(optimizer_uri, bytes) else os.fspath(optimizer_uri)
        self._optimizer = OptimizerEngine(source, module._engine)

    def step(self) -> None:
        self._optimizer.step()

    def set_learning_rate(self, learning_rate: float) -> None:
        self._optimizer.set_learning_rate(learning_rate)

    def get_learning_rate(self) -> float:
        return self._optimizer.get_learning_rate()
