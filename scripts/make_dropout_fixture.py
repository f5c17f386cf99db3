"""Generate tests/fixtures/dropout/: training artifacts of a tiny model with an active Dropout.

    python scripts/make_dropout_fixture.py [--out tests/fixtures/dropout]

The model is ``Linear(6, 16) -> ReLU -> Dropout(0.5) -> Linear(16, 3)``, exported with
``torch.onnx.export(..., dynamo=False, training=TrainingMode.TRAINING,
do_constant_folding=False)`` so the Dropout node keeps ``training_mode=True`` in the training
graph (``generate_artifacts`` blanks it in the eval graph), then turned into artifacts by
onnxruntime-training 1.19.2's ``generate_artifacts`` (MSE loss, AdamW).  Writes
``training_model.onnx``, ``eval_model.onnx``, ``optimizer_model.onnx`` and ``checkpoint``.
The files are committed (a few KB) so tests/test_capi_session.py's ``set_seed`` test runs where
onnxruntime-training cannot be installed; the test regenerates them into a temporary
directory with ``generate`` when the committed copy is missing and onnxruntime-training is
importable.

There is no expected.npz: ORT's dropout masks come from its own generator, so only
reproducibility (same seed, same numbers) is checked, not parity.
"""

from __future__ import annotations

import argparse
import io
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "tests" / "fixtures" / "dropout"
MAX_IR_VERSION = 10  # ORT 1.19 refuses newer IR versions, which onnx >= 1.17 writes
ARTIFACTS = ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx")


def generate(out_dir) -> pathlib.Path:
    """Write the dropout artifacts into `out_dir` (created if needed); returns the directory."""
    import onnx
    import onnxruntime
    import torch
    from onnxruntime.training import artifacts

    onnxruntime.set_default_logger_severity(3)
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    class DropoutMLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = torch.nn.Linear(6, 16)
            self.drop = torch.nn.Dropout(0.5)
            self.fc2 = torch.nn.Linear(16, 3)

        def forward(self, x):
            return self.fc2(self.drop(torch.relu(self.fc1(x))))

    torch.manual_seed(0)
    model = DropoutMLP().train()
    buffer = io.BytesIO()
    torch.onnx.export(
        model,
        (torch.randn(4, 6),),
        buffer,
        input_names=["x"],
        output_names=["y"],
        dynamo=False,
        opset_version=17,
        training=torch.onnx.TrainingMode.TRAINING,
        do_constant_folding=False,
    )
    proto = onnx.load_from_string(buffer.getvalue())
    params = [init.name for init in proto.graph.initializer]
    artifacts.generate_artifacts(
        proto,
        requires_grad=params,
        frozen_params=[],
        loss=artifacts.LossType.MSELoss,
        optimizer=artifacts.OptimType.AdamW,
        artifact_directory=str(out),
    )
    for name in ARTIFACTS:
        path = out / name
        model_proto = onnx.load(str(path))
        model_proto.ir_version = min(model_proto.ir_version, MAX_IR_VERSION)
        onnx.save(model_proto, str(path))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    args = parser.parse_args(argv)
    out = generate(args.out)
    print(f"wrote {sorted(p.name for p in out.iterdir())} to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
