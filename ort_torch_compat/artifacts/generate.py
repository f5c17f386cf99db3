"""``generate_artifacts``: onnxruntime-training 1.19.2's signature and files, built by this library.

Everything is built in memory first; only when the training, eval and optimizer models and
the checkpoint all exist are the files written (each atomically).  So an unsupported op, a
bad argument or an unknown optimizer leaves the artifact directory untouched, where ORT
may already have written some files.
"""

from __future__ import annotations

import logging
import os
import pathlib
from enum import Enum
from typing import Callable, List, Optional, Tuple, Union

import onnx

from .. import onnxblock
from ..atomic_files import atomic_write
from ..errors import ArtifactGenerationError
from ..onnxblock.checkpoint_utils import save_checkpoint

logger = logging.getLogger(__name__)

#: Above this size protobuf cannot hold the model; ORT then wants a path.
USE_PATH_THRESHOLD = 2147483648


class LossType(Enum):
    """Loss added to the training model (``generate_artifacts(loss=...)``)."""

    MSELoss = 1
    CrossEntropyLoss = 2
    BCEWithLogitsLoss = 3
    L1Loss = 4


class OptimType(Enum):
    """Optimizer of the optimizer model (``generate_artifacts(optimizer=...)``)."""

    AdamW = 1
    SGD = 2


_LOSS_BLOCKS = {
    LossType.MSELoss: onnxblock.loss.MSELoss,
    LossType.CrossEntropyLoss: onnxblock.loss.CrossEntropyLoss,
    LossType.BCEWithLogitsLoss: onnxblock.loss.BCEWithLogitsLoss,
    LossType.L1Loss: onnxblock.loss.L1Loss,
}
_OPTIMIZER_BLOCKS = {OptimType.AdamW: onnxblock.optim.AdamW, OptimType.SGD: onnxblock.optim.SGD}


def _load_model(model: Union[onnx.ModelProto, str, os.PathLike]) -> Tuple[onnx.ModelProto, Optional[str]]:
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        return onnx.load(path), path
    if isinstance(model, onnx.ModelProto):
        if model.ByteSize() > USE_PATH_THRESHOLD:
            raise RuntimeError("This model is > 2GB. Please pass in a path to the ONNX file instead.")
        return model, None
    raise RuntimeError("Please pass in either a string or an ONNX ModelProto for the model.")


def _resolve_block(value: object, kind: type, blocks: dict, error: type, what: str) -> onnxblock.Block:
    """The block for `value`: a new one for a member of the enum `kind`, a Block as given.

    Anything else raises `error` with ORT's message (ORT raises RuntimeError for a loss and
    TypeError for an optimizer).
    """
    if isinstance(value, kind):
        return blocks[value]()
    if isinstance(value, onnxblock.Block):
        return value
    raise error(
        f"Unknown {what} provided {type(value)}. Expected {what} to be either one of"
        f"onnxruntime.training.artifacts.{kind.__name__} or onnxruntime.training.onnxblock.Block."
    )


class _TrainingBlock(onnxblock.TrainingBlock):
    """The loss on the model's outputs (or on ``loss_input_names``), plus additional outputs."""

    def __init__(
        self, loss: onnxblock.Block, loss_input_names: Optional[List[str]], additional_output_names: Optional[List[str]]
    ):
        super().__init__()
        self._loss = loss
        self._loss_input_names = loss_input_names
        self._additional_output_names = additional_output_names

    def build(self, *inputs_to_loss: str):
        if self._loss_input_names:
            inputs_to_loss = self._loss_input_names
        loss_output = self._loss(*inputs_to_loss)
        if not self._additional_output_names:  # (generate_artifacts checked that it is a list)
            return loss_output
        if isinstance(loss_output, tuple):
            return (*loss_output, *self._additional_output_names)
        return (loss_output, *self._additional_output_names)


def generate_artifacts(
    model: Union[onnx.ModelProto, str],
    requires_grad: Optional[List[str]] = None,
    frozen_params: Optional[List[str]] = None,
    loss: Optional[Union[LossType, onnxblock.Block]] = None,
    optimizer: Optional[Union[OptimType, onnxblock.Block]] = None,
    artifact_directory: Optional[Union[str, bytes, os.PathLike]] = None,
    prefix: str = "",
    ort_format: bool = False,
    custom_op_library: Optional[Union[str, bytes, os.PathLike]] = None,
    additional_output_names: Optional[List[str]] = None,
    nominal_checkpoint: bool = False,
    loss_input_names: Optional[List[str]] = None,
) -> None:
    """Write ``training_model.onnx``, ``eval_model.onnx``, ``checkpoint`` and ``optimizer_model.onnx``.

    Same arguments, file names and conventions as onnxruntime-training 1.19.2's
    ``onnxruntime.training.artifacts.generate_artifacts``; the files train on ORT's training
    runtime (and on ``ort_torch_compat.api``) to the numbers ORT's own artifacts give.
    Differences (node names, which ops the backward uses, ORT's fusions left out) are listed
    in docs/artifacts.md.  ``ort_format=True`` also writes each model in ORT format
    (``training_model.ort`` ...) with ONNX Runtime's converter, as ORT does; it needs the
    ``onnxruntime`` package.

    Raises:
        RuntimeError: an unknown loss, a parameter both frozen and trainable, a bad model argument.
        TypeError: an unknown optimizer.
        UnsupportedGradientError: ops between the trainable parameters and the loss without a
            gradient builder (all of them named).
        ArtifactGenerationError: other reasons the model cannot be trained (e.g. a trainable
            parameter that does not reach the loss).
        ImportError: ``ort_format=True`` where the ``onnxruntime`` package (its model converter
            ``onnxruntime.tools.convert_onnx_models_to_ort``) is not importable.
    """
    loaded_model, model_path = _load_model(model)
    loss_block = (
        onnxblock.blocks.PassThrough()
        if loss is None
        else _resolve_block(loss, LossType, _LOSS_BLOCKS, RuntimeError, "loss")
    )
    optimizer_block = (
        None if optimizer is None else _resolve_block(optimizer, OptimType, _OPTIMIZER_BLOCKS, TypeError, "optimizer")
    )
    convert = _ort_converter() if ort_format else None
    if requires_grad is not None and frozen_params is not None and set(requires_grad) & set(frozen_params):
        raise RuntimeError(
            "A parameter cannot be frozen and require gradient computation at the same "
            f"time {set(requires_grad) & set(frozen_params)}"
        )
    if additional_output_names is not None and not isinstance(additional_output_names, list):
        raise RuntimeError(
            f"Unknown type provided for additional output names {type(additional_output_names)}. "
            "Expected additional output names to be a list of strings."
        )

    if custom_op_library is not None:
        if not os.path.exists(custom_op_library):
            raise RuntimeError(f"Custom op library path {custom_op_library} does not exist.")
        logger.info("custom op library %s: accepted; its ops have no gradient builders here", custom_op_library)
    directory = pathlib.Path(os.fsdecode(artifact_directory)) if artifact_directory is not None else pathlib.Path.cwd()
    if not directory.is_dir():
        raise FileNotFoundError(f"artifact_directory {str(directory)!r} is not an existing directory")

    _check_parameters_are_initializers(loaded_model, requires_grad, frozen_params)
    training_block = _TrainingBlock(loss_block, loss_input_names, additional_output_names)
    for name in requires_grad or []:
        training_block.requires_grad(name)
    for name in frozen_params or []:
        training_block.requires_grad(name, False)

    with onnxblock.base(loaded_model, model_path):
        training_block(*[output.name for output in loaded_model.graph.output])
        training_model, eval_model = training_block.to_model_proto()
        parameters = training_block.parameters()

    optimizer_model = None
    if optimizer_block is not None:
        with onnxblock.empty_base(opset_version=_onnx_opset(loaded_model)):
            optimizer_block(parameters)
            optimizer_model = optimizer_block.to_model_proto()

    writes: List[Tuple[str, Callable[[pathlib.Path], None]]] = [
        ("training_model.onnx", lambda p: atomic_write(str(p), training_model.SerializeToString(), "training model")),
        ("eval_model.onnx", lambda p: atomic_write(str(p), eval_model.SerializeToString(), "eval model")),
        ("checkpoint", lambda p: save_checkpoint(parameters, p, nominal_checkpoint=False)),
    ]
    if nominal_checkpoint:
        writes.append(("nominal_checkpoint", lambda p: save_checkpoint(parameters, p, nominal_checkpoint=True)))
    if optimizer_model is not None:
        writes.append(
            (
                "optimizer_model.onnx",
                lambda p: atomic_write(str(p), optimizer_model.SerializeToString(), "optimizer model"),
            )
        )
    for name, write in writes:
        path = directory / f"{prefix}{name}"
        write(path)
        logger.info("Saved %s", path)
        if convert is not None and name.endswith(".onnx"):
            convert(path, directory, custom_op_library)


def _ort_converter() -> Callable[[pathlib.Path, pathlib.Path, Optional[Union[str, bytes, os.PathLike]]], None]:
    """ORT's ``convert_onnx_models_to_ort`` as ORT's generate_artifacts calls it for ``ort_format=True``
    (Fixed optimization style, next to the .onnx file: ``<prefix>training_model.ort`` ...), or an
    ImportError saying what to install, raised before any file is written."""
    try:
        from onnxruntime.tools.convert_onnx_models_to_ort import OptimizationStyle, convert_onnx_models_to_ort
    except ImportError as error:
        raise ImportError(
            "ort_format=True needs ONNX Runtime's ONNX-to-ORT converter (onnxruntime.tools.convert_onnx_models_to_ort), "
            f"which is not importable ({error}); install onnxruntime(-training), or generate the .onnx artifacts and "
            "convert them with `python -m onnxruntime.tools.convert_onnx_models_to_ort DIR` where it is installed"
        ) from error

    def convert(
        path: pathlib.Path, directory: pathlib.Path, custom_op_library: Optional[Union[str, bytes, os.PathLike]]
    ) -> None:
        library = None if custom_op_library is None else pathlib.Path(os.fsdecode(custom_op_library))
        convert_onnx_models_to_ort(
            path, output_dir=directory, custom_op_library_path=library, optimization_styles=[OptimizationStyle.Fixed]
        )
        logger.info("Saved %s", path.with_suffix(".ort"))

    return convert


def _check_parameters_are_initializers(
    model: onnx.ModelProto, requires_grad: Optional[List[str]], frozen_params: Optional[List[str]]
) -> None:
    """Parameters are initializers; a graph input named as one would be silently left out
    (and the model then has no trainable parameter): name it and say what to do."""
    initializers = {init.name for init in model.graph.initializer}
    inputs = {info.name for info in model.graph.input} - initializers
    for argument, names in (("requires_grad", requires_grad), ("frozen_params", frozen_params)):
        fed = [name for name in names or [] if name in inputs]
        if fed:
            raise ArtifactGenerationError(
                f"{argument} names {fed}, which are graph inputs of the model, not initializers: parameters must be "
                "initializers (export the model with its weights, e.g. torch.onnx.export(..., export_params=True), "
                "or move them into graph.initializer with onnx.numpy_helper.from_array)"
            )


def _onnx_opset(model: onnx.ModelProto) -> Optional[int]:
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx"):
            return opset.version
    return None
