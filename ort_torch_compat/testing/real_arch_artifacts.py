"""Export a real-architecture recipe (``real_arch_models.RECIPES``) to ONNX and make ORT
training artifacts from it with onnxruntime-training 1.19.2's ``generate_artifacts``,
the way users make them.

Variants (``Variant``):
- ``opset``: 14 (the default of many exporters, Hugging Face's included) or 17;
- ``export``: ``"train"`` (``TrainingMode.TRAINING``: BatchNorm with batch statistics) or
  ``"eval"`` (a freshly initialised model exported in eval mode: the exporter de-duplicates
  identical initializers, so BatchNorm running stats become ``Identity`` of weights/biases);
- ``stats``: ``"frozen"`` (float buffers such as running stats go to ``frozen_params``, the
  checkpoint holds them) or ``"initializer"`` (left as initializers inside the models);
- ``optimizer``: ``"adamw"`` or ``"sgd"``;
- ``exporter``: ``"torchscript"`` (``torch.onnx.export(dynamo=False)``, the committed fixtures)
  or ``"dynamo"`` (``dynamo=True, optimize=False``: the exporter's default optimizer folds
  weight transposes into new initializers, which then stop being trainable by name);
- ``generator``: ``"ort"`` (onnxruntime-training's ``generate_artifacts``, after
  ``prepare_for_artifacts``) or ``"ours"`` (``ort_torch_compat.artifacts.generate_artifacts``,
  the one there is on Python 3.12+).
The tag of the TorchScript/ORT variants is what it was before the last two existed (the
fixtures' directory names); the others add ``_dynamo`` and ``_ours``.
Checkpoints are nominal (``nominal_checkpoint=True``) when asked: fixtures then stay small
and the scenario fills the parameters from a seeded generator (``ort_torch_compat/testing/scenario.py``).

    python scripts/real_arch_artifacts.py resnet18 OUT_DIR [--opset 17] [--export train]
        [--stats frozen] [--optimizer adamw] [--exporter torchscript] [--generator ort]
        [--size test] [--nominal]
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import pathlib
import warnings
from typing import Any, Dict, List

from . import prepare_for_artifacts as prep
from . import real_arch_models as zoo

LOSS_BLOCKS = {"ce": "CrossEntropyLoss", "mse": "MSELoss"}


@dataclasses.dataclass(frozen=True)
class Variant:
    opset: int = 17
    export: str = "train"
    stats: str = "frozen"
    optimizer: str = "adamw"
    exporter: str = "torchscript"
    generator: str = "ort"

    def __post_init__(self):
        if self.exporter not in EXPORTERS:
            raise ValueError(f"exporter must be one of {EXPORTERS}, got {self.exporter!r}")
        if self.generator not in GENERATORS:
            raise ValueError(f"generator must be one of {GENERATORS}, got {self.generator!r}")

    @property
    def tag(self) -> str:
        tag = f"op{self.opset}_{self.export}_{self.stats}_{self.optimizer}"
        if self.exporter != "torchscript":
            tag += f"_{self.exporter}"
        if self.generator != "ort":
            tag += f"_{self.generator}"
        return tag


EXPORTERS = ("torchscript", "dynamo")
GENERATORS = ("ort", "ours")


def export_onnx(built: "zoo.Built", opset: int, export: str, exporter: str = "torchscript"):
    """torch.onnx.export to a ModelProto: the TorchScript exporter (as ORT's tutorials use), or
    the dynamo exporter with ``optimize=False`` (its default optimizer folds Transpose/Reshape
    of weights into new initializers with generated names, so those parameters would silently
    stop being trainable).  The dynamo exporter has no ``training`` argument: it traces the
    module in the mode it is in."""
    import onnx
    import torch

    if exporter not in EXPORTERS:
        raise ValueError(f"exporter must be one of {EXPORTERS}, got {exporter!r}")
    mode = torch.onnx.TrainingMode.TRAINING if export == "train" else torch.onnx.TrainingMode.EVAL
    built.model.train(export == "train")
    names = [name for name, *_ in built.inputs]
    args = tuple(tensor for _, tensor, *_ in built.inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if exporter == "dynamo":
            return prep.export_dynamo(built.model, args, names, "output", opset)
        buffer = io.BytesIO()
        torch.onnx.export(
            built.model,
            args,
            buffer,
            dynamo=False,
            opset_version=opset,
            input_names=names,
            output_names=["output"],
            training=mode,
            do_constant_folding=False,
        )
    return onnx.load_from_string(buffer.getvalue())


def canonical_parameter_names(module) -> Dict[str, str]:
    """Every module path of every parameter (tied ones have several) -> the path
    ``named_parameters()`` reports for it."""
    first = {id(p): name for name, p in module.named_parameters()}
    return {name: first[id(p)] for name, p in module.named_parameters(remove_duplicate=False)}


def split_parameters(built: "zoo.Built", model, stats: str):
    """(requires_grad, frozen_params) over the exported initializers, in initializer order.

    A tied parameter (GPT-2's embedding and LM head) is one initializer, named after any of
    its module paths: the TorchScript exporter names it ``model.transformer.wte.weight``, the
    dynamo exporter ``model.lm_head.weight``; both are recognised (``frozen`` is asked about the
    first path, the one ``named_parameters()`` gives)."""
    params = canonical_parameter_names(built.model)
    buffers = dict(built.model.named_buffers())
    requires_grad: List[str] = []
    frozen: List[str] = []
    for init in model.graph.initializer:
        name = init.name
        if name in params:
            (frozen if built.frozen(params[name]) else requires_grad).append(name)
        elif name in buffers and buffers[name].dtype.is_floating_point and stats == "frozen":
            frozen.append(name)
    return requires_grad, frozen


def artifacts_from_export(
    built: "zoo.Built", exported, out_dir: "str | pathlib.Path", variant: Variant = Variant(), nominal: bool = False
):
    """The four artifacts (plus ``inference.onnx``) of an exported model, by the variant's
    generator; returns (requires_grad, frozen_params)."""
    import copy

    import onnx

    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if variant.generator == "ort":
        from onnxruntime.training import artifacts

        model = prep.prepare_model(copy.deepcopy(exported))
    else:
        from ort_torch_compat import artifacts

        model = copy.deepcopy(exported)
    requires_grad, frozen = split_parameters(built, model, variant.stats)
    optimizer = artifacts.OptimType.AdamW if variant.optimizer == "adamw" else artifacts.OptimType.SGD
    artifacts.generate_artifacts(
        model,
        requires_grad=requires_grad,
        frozen_params=frozen,
        loss=getattr(artifacts.LossType, LOSS_BLOCKS[built.loss]),
        optimizer=optimizer,
        artifact_directory=out,
        nominal_checkpoint=nominal,
    )
    if variant.generator == "ort":
        for path in sorted(out.glob("*.onnx")):
            saved = onnx.load(str(path))
            if path.name == "eval_model.onnx":
                prep.prune_batchnorm_outputs(saved.graph)
            prep.set_ir_version(saved)
            onnx.save(saved, str(path))
    onnx.save(prep.set_ir_version(copy.deepcopy(exported)), str(out / "inference.onnx"))
    return requires_grad, frozen


def make_artifacts(
    name: str, out_dir: "str | pathlib.Path", variant: Variant = Variant(), size: str = "test", nominal: bool = False
) -> Dict[str, Any]:
    """Write the four artifacts (plus ``inference.onnx``, the exported model) into ``out_dir``;
    return a description (parameter split, inputs, classes) for the scenario spec."""
    recipe = zoo.RECIPES[name]
    built = recipe.build(size)
    exported = export_onnx(built, variant.opset, variant.export, variant.exporter)
    requires_grad, frozen = artifacts_from_export(built, exported, out_dir, variant, nominal)
    return {
        "recipe": name,
        "variant": dataclasses.asdict(variant),
        "size": size,
        "nominal": nominal,
        "loss": built.loss,
        "classes": built.classes,
        "inputs": [
            {"name": n, "shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""), "kind": kind, "high": high}
            for n, t, kind, high in built.inputs
        ],
        "trainable_params": requires_grad,
        "frozen_params": frozen,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", choices=sorted(zoo.RECIPES))
    parser.add_argument("out_dir")
    parser.add_argument("--opset", type=int, default=17)
    parser.add_argument("--export", choices=["train", "eval"], default="train")
    parser.add_argument("--stats", choices=["frozen", "initializer"], default="frozen")
    parser.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw")
    parser.add_argument("--exporter", choices=EXPORTERS, default="torchscript")
    parser.add_argument("--generator", choices=GENERATORS, default="ort")
    parser.add_argument("--size", choices=zoo.SIZES, default="test")
    parser.add_argument("--nominal", action="store_true")
    args = parser.parse_args()
    variant = Variant(args.opset, args.export, args.stats, args.optimizer, args.exporter, args.generator)
    info = make_artifacts(args.recipe, args.out_dir, variant, args.size, args.nominal)
    print(json.dumps(info, indent=1))
    return 0
