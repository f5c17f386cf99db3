"""Record ONNX Runtime checkpoints saved mid-training, for the resume tests.

    python scripts/make_resume_fixtures.py

For a few fixture configs, onnxruntime-training 1.19.2 runs scenario steps 1-2 (the same
inputs as ort_torch_compat/testing/scenario.py), adds properties of all three types, and saves
`ort_after_step2.ckpt` with its optimizer state next to the fixture.  The tests resume
from it with ort_torch_compat and compare steps 3-5 with ORT's uninterrupted run.
"""

from __future__ import annotations

import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent
CONFIGS = ["mlp_ce_adamw_op17", "cnn_mse_sgd_op17", "transformer_ce_adamw_op17"]
PROPERTIES = {"epoch": 2, "best_loss": 0.25, "run": "ort-1.19.2"}


def main() -> None:
    from onnxruntime.training import api

    from ort_torch_compat.testing.lifecycle import train_steps

    for config in CONFIGS:
        directory = ROOT / "tests" / "fixtures" / config
        spec = json.loads((directory / "spec.json").read_text())
        state = api.CheckpointState.load_checkpoint(str(directory / "checkpoint"))
        module = api.Module(str(directory / "training_model.onnx"), state, str(directory / "eval_model.onnx"))
        optimizer = api.Optimizer(str(directory / "optimizer_model.onnx"), module)
        optimizer.set_learning_rate(float(spec["lr"]))
        train_steps(state, module, optimizer, spec, 1, 2)
        for name, value in PROPERTIES.items():
            state.properties[name] = value
        api.CheckpointState.save_checkpoint(
            state, str(directory / "ort_after_step2.ckpt"), include_optimizer_state=True
        )
        print(f"wrote {directory / 'ort_after_step2.ckpt'}")


if __name__ == "__main__":
    main()
