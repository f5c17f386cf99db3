"""Generate the small artifacts used by examples/ (run once with onnxruntime-training 1.19.2).

    python scripts/make_example_artifacts.py

Writes examples/artifacts/mlp_classifier/{training,eval,optimizer}_model.onnx and checkpoint
for a 2-16-16-3 MLP classifier (CrossEntropy, AdamW).  The files are committed so the
examples run where onnxruntime-training cannot be installed.

examples/models/mlp_classifier.onnx, the input of README's "Making artifacts" snippet, is the
inference model of these artifacts:
``ort-torch-compat export examples/artifacts/mlp_classifier examples/models/mlp_classifier.onnx``.
"""

from __future__ import annotations

import pathlib

import onnx
import torch

OUT = pathlib.Path(__file__).resolve().parent.parent / "examples" / "artifacts" / "mlp_classifier"
MAX_IR_VERSION = 10  # ORT 1.19 refuses newer IR versions, which onnx >= 1.17 writes


def main() -> None:
    from onnxruntime.training import artifacts

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(2, 16), torch.nn.GELU(), torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)
    )
    OUT.mkdir(parents=True, exist_ok=True)
    exported = OUT / "model.onnx"
    torch.onnx.export(
        model,
        (torch.randn(8, 2),),
        str(exported),
        input_names=["features"],
        output_names=["logits"],
        dynamic_axes={"features": {0: "batch"}, "logits": {0: "batch"}},
        dynamo=False,
        opset_version=17,
    )
    proto = onnx.load(str(exported))
    exported.unlink()
    params = [init.name for init in proto.graph.initializer]
    artifacts.generate_artifacts(
        proto,
        requires_grad=params,
        frozen_params=[],
        loss=artifacts.LossType.CrossEntropyLoss,
        optimizer=artifacts.OptimType.AdamW,
        artifact_directory=str(OUT),
    )
    for name in ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx"):
        model_proto = onnx.load(str(OUT / name))
        model_proto.ir_version = min(model_proto.ir_version, MAX_IR_VERSION)
        onnx.save(model_proto, str(OUT / name))
    print(f"wrote {sorted(p.name for p in OUT.iterdir())} to {OUT}")


if __name__ == "__main__":
    main()
