"""Generate tests/fixtures/dropout_grad/: issue 18's minimal case of ORT's Dropout gradient.

    python scripts/make_dropout_grad_fixture.py [--out tests/fixtures/dropout_grad]

The model is ``y = Dropout(x @ W, ratio=0.5)`` at opset 13 with no training_mode input (the
Dropout is inactive: the forward is the identity) and the mask output declared, as exporters
write it; ``generate_artifacts`` (MSE loss, AdamW, W trained) turns it into artifacts.  One
``onnxruntime.training.api`` train step on fixed inputs gives the loss and W's gradient:
``expected.npz`` (x, target, loss, grad_W).  ORT's gradient is 2x the derivative: its
DropoutGrad divides by (1 - ratio) although the forward did not drop anything.
"""

from __future__ import annotations

import argparse
import pathlib

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO / "tests" / "fixtures" / "dropout_grad"
MAX_IR_VERSION = 10  # ORT 1.19 refuses newer IR versions, which onnx >= 1.17 writes
ARTIFACTS = ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx")


def model():
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = np.random.default_rng(0).standard_normal((6, 5)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Dropout", ["h", "ratio"], ["y", "mask"])]
    graph = helper.make_graph(
        nodes,
        "matmul_dropout",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 5])],
        initializer=[numpy_helper.from_array(weight, "W"), numpy_helper.from_array(np.array(0.5, np.float32), "ratio")],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    proto.ir_version = 8
    onnx.checker.check_model(proto)
    return proto


def inputs():
    rng = np.random.default_rng(1)
    return rng.standard_normal((4, 6)).astype(np.float32), rng.standard_normal((4, 5)).astype(np.float32)


def ort_step(directory: pathlib.Path):
    """(loss, grad of W) from one ONNX Runtime train step on the artifacts in `directory`."""
    from onnxruntime.training import api

    x, target = inputs()
    state = api.CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    module = api.Module(str(directory / "training_model.onnx"), state, str(directory / "eval_model.onnx"))
    loss = module(x, target)
    return np.asarray(loss), np.array(state.parameters["W"].grad)


def generate(out_dir) -> pathlib.Path:
    import onnx
    import onnxruntime
    from onnxruntime.training import artifacts

    onnxruntime.set_default_logger_severity(3)
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    artifacts.generate_artifacts(
        model(),
        requires_grad=["W"],
        frozen_params=[],
        loss=artifacts.LossType.MSELoss,
        optimizer=artifacts.OptimType.AdamW,
        artifact_directory=str(out),
    )
    for name in ARTIFACTS:
        proto = onnx.load(str(out / name))
        proto.ir_version = min(proto.ir_version, MAX_IR_VERSION)
        onnx.save(proto, str(out / name))
    x, target = inputs()
    loss, grad = ort_step(out)
    np.savez(out / "expected.npz", x=x, target=target, loss=loss, grad_W=grad)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    out = generate(parser.parse_args(argv).out)
    print(f"wrote {sorted(p.name for p in out.iterdir())} to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
