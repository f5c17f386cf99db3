"""The model the blocks edit: ``base(model)``, ``empty_base()``, ``custom_op_library(path)``.

As in onnxruntime-training, one model at a time is registered process-wide and every block
called inside the ``with`` edits it.
"""

from __future__ import annotations

import copy
import os
from contextlib import contextmanager
from typing import Iterator, Optional

import onnx

#: The highest IR version onnxruntime 1.19 loads; onnx >= 1.17 stamps newer ones.
MAX_ORT_IR_VERSION = 10


class ModelAccessor:
    """Holds the model being built (and the path it came from, for models above 2 GB)."""

    def __init__(self, model: onnx.ModelProto, model_path: Optional[str] = None):
        self._model = model
        self._path = model_path
        self.external_tensors = None  # blocks.py's temp copy of the big tensors, for models given by path

    @property
    def model(self) -> onnx.ModelProto:
        if self._model is None:
            raise RuntimeError(
                "The onnx model was not set. Please use the context manager onnxblock.base to create the model."
            )
        return self._model

    @property
    def path(self) -> str:
        if self._path is None:
            raise RuntimeError("The path to the onnx model was not set. Pass a path to onnxblock.base.")
        return self._path

    @property
    def has_path(self) -> bool:
        return self._path is not None


_GLOBAL_ACCESSOR: Optional[ModelAccessor] = None
_GLOBAL_CUSTOM_OP_LIBRARY: Optional[os.PathLike] = None


def current() -> ModelAccessor:
    """The registered accessor; a clear error when a block is used outside ``base``/``empty_base``."""
    if _GLOBAL_ACCESSOR is None:
        raise RuntimeError(
            "No base model: call blocks inside `with onnxblock.base(model):` or `with onnxblock.empty_base():`."
        )
    return _GLOBAL_ACCESSOR


def custom_op_library_path() -> Optional[os.PathLike]:
    return _GLOBAL_CUSTOM_OP_LIBRARY


@contextmanager
def base(model: onnx.ModelProto, model_path: Optional[str] = None) -> Iterator[ModelAccessor]:
    """Register a copy of ``model`` as the model the blocks edit (``model_path`` for models > 2 GB)."""
    global _GLOBAL_ACCESSOR  # noqa: PLW0603
    if _GLOBAL_ACCESSOR is not None:
        raise RuntimeError("Base onnx model already exists. Cannot create multiple ModelAccessors.")
    if model is None:
        raise RuntimeError(
            "Base onnx model cannot be None. Please use onnxblock.empty_base if you would like to build a "
            "model from scratch."
        )
    _GLOBAL_ACCESSOR = ModelAccessor(copy.deepcopy(model), model_path)
    try:
        yield _GLOBAL_ACCESSOR
    finally:
        if _GLOBAL_ACCESSOR.external_tensors is not None:
            _GLOBAL_ACCESSOR.external_tensors.close()
        _GLOBAL_ACCESSOR = None


@contextmanager
def empty_base(opset_version: Optional[int] = None) -> Iterator[ModelAccessor]:
    """Register a new empty model (producer ``orttraining``, graph ``graph``), as the optimizer model starts.

    The IR version is onnx's own capped at 10: onnxruntime-training writes onnx's, which
    onnxruntime 1.19 then refuses to load when onnx is 1.17 or newer.
    """
    global _GLOBAL_ACCESSOR  # noqa: PLW0603
    if _GLOBAL_ACCESSOR is not None:
        raise RuntimeError("Base onnx model already exists. Cannot create multiple ModelAccessors.")
    model = onnx.ModelProto()
    model.ir_version = min(onnx.IR_VERSION, MAX_ORT_IR_VERSION)
    model.producer_name = "orttraining"
    model.graph.name = "graph"
    model.opset_import.extend(
        (
            onnx.helper.make_opsetid("com.microsoft", 1),
            onnx.helper.make_opsetid("", opset_version or onnx.defs.onnx_opset_version()),
        )
    )
    _GLOBAL_ACCESSOR = ModelAccessor(model, None)
    try:
        yield _GLOBAL_ACCESSOR
    finally:
        _GLOBAL_ACCESSOR = None


@contextmanager
def custom_op_library(custom_op_library_path: os.PathLike) -> Iterator[os.PathLike]:
    """Record a custom op library (accepted for compatibility; its ops get no gradients here)."""
    global _GLOBAL_CUSTOM_OP_LIBRARY  # noqa: PLW0603
    if _GLOBAL_CUSTOM_OP_LIBRARY is not None:
        raise RuntimeError("CustomOp library already set. Cannot set multiple custom op libraries.")
    if not os.path.exists(custom_op_library_path):
        raise RuntimeError(f"Custom op library path {custom_op_library_path} does not exist.")
    _GLOBAL_CUSTOM_OP_LIBRARY = copy.copy(custom_op_library_path)
    try:
        yield _GLOBAL_CUSTOM_OP_LIBRARY
    finally:
        _GLOBAL_CUSTOM_OP_LIBRARY = None
