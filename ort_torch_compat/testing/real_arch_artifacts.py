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
- ``optimizer``: ``"adamw"`` or ``"sgd"``.
Checkpoints are nominal (``nominal_checkpoint=True``) when asked: fixtures then stay small
and the scenario fills the parameters from a seeded generator (``ort_torch_compat/testing/scenario.py``).

    python scripts/real_arch_artifacts.py resnet18 OUT_DIR [--opset 17] [--export train]
        [--stats frozen] [--optimizer adamw] [--size test] [--nominal]
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

    @property
    def tag(self) -> str:
        return f"op{self.opset}_{self.export}_{self.stats}_{self.optimizer}"


def export_onnx(built: "zoo.Built", opset: int, export: str):
    """torch.onnx.export (TorchScript exporter, as ORT's tutorials use) to a ModelProto."""
    import onnx
    import torch

    mode = torch.onnx.TrainingMode.TRAINING if export == "train" else torch.onnx.TrainingMode.EVAL
    built.model.train(export == "train")
    names = [name for name, *_ in built.inputs]
    args = tuple(tensor for _, tensor, *_ in built.inputs)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
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


def split_parameters(built: "zoo.Built", model, stats: str):
    """(requires_grad, frozen_params) over the exported initializers, in initializer order."""
    params = dict(built.model.named_parameters())
    buffers = dict(built.model.named_buffers())
    requires_grad: List[str] = []
    frozen: List[str] = []
    for init in model.graph.initializer:
        name = init.name
        if name in params:
            (frozen if built.frozen(name) else requires_grad).append(name)
        elif name in buffers and buffers[name].dtype.is_floating_point and stats == "frozen":
            frozen.append(name)
    return requires_grad, frozen


def make_artifacts(
    name: str, out_dir: "str | pathlib.Path", variant: Variant = Variant(), size: str = "test", nominal: bool = False
) -> Dict[str, Any]:
    """Write the four artifacts (plus ``inference.onnx``, the exported model) into ``out_dir``;
    return a description (parameter split, inputs, classes) for the scenario spec."""
    import onnx
    from onnxruntime.training import artifacts

    recipe = zoo.RECIPES[name]
    built = recipe.build(size)
    exported = export_onnx(built, variant.opset, variant.export)
    prepared = prep.prepare_model(exported)
    requires_grad, frozen = split_parameters(built, prepared, variant.stats)
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    optimizer = artifacts.OptimType.AdamW if variant.optimizer == "adamw" else artifacts.OptimType.SGD
    artifacts.generate_artifacts(
        prepared,
        requires_grad=requires_grad,
        frozen_params=frozen,
        loss=getattr(artifacts.LossType, LOSS_BLOCKS[built.loss]),
        optimizer=optimizer,
        artifact_directory=out,
        nominal_checkpoint=nominal,
    )
    for path in sorted(out.glob("*.onnx")):
        model = onnx.load(str(path))
        if path.name == "eval_model.onnx":
            prep.prune_batchnorm_outputs(model.graph)
        prep.set_ir_version(model)
        onnx.save(model, str(path))
    onnx.save(prep.set_ir_version(exported), str(out / "inference.onnx"))
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
    parser.add_argument("--size", choices=zoo.SIZES, default="test")
    parser.add_argument("--nominal", action="store_true")
    args = parser.parse_args()
    variant = Variant(args.opset, args.export, args.stats, args.optimizer)
    info = make_artifacts(args.recipe, args.out_dir, variant, args.size, args.nominal)
    print(json.dumps(info, indent=1))
    return 0
