"""End-to-end training of ORT artifacts with the drop-in API (no onnxruntime-training needed).

    python examples/train_classifier.py [--steps 300] [--out /tmp/ort_torch_compat_example]

Trains the committed MLP artifacts (examples/artifacts/mlp_classifier, made once by
scripts/make_example_artifacts.py with onnxruntime-training 1.19.2) on a synthetic
3-class problem, evaluates, saves a resumable checkpoint and exports an inference model.
The only line that differs from an onnxruntime-training script is the import.
"""

from __future__ import annotations

import argparse
import pathlib
import tempfile

import numpy as np

from ort_torch_compat.api import CheckpointState, LinearLRScheduler, Module, Optimizer

ARTIFACTS = pathlib.Path(__file__).resolve().parent / "artifacts" / "mlp_classifier"


def synthetic_batch(rng: np.random.Generator, size: int):
    """Three Gaussian blobs in 2-D: an easy problem whose accuracy shows training works."""
    centers = np.array([[-2.0, 0.0], [2.0, 0.0], [0.0, 2.5]], dtype=np.float32)
    labels = rng.integers(0, 3, size=size)
    features = centers[labels] + rng.normal(scale=0.7, size=(size, 2)).astype(np.float32)
    return features.astype(np.float32), labels.astype(np.int64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument(
        "--out", type=pathlib.Path, default=pathlib.Path(tempfile.gettempdir()) / "ort_torch_compat_example"
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)

    state = CheckpointState.load_checkpoint(ARTIFACTS / "checkpoint")
    module = Module(ARTIFACTS / "training_model.onnx", state, ARTIFACTS / "eval_model.onnx")
    optimizer = Optimizer(ARTIFACTS / "optimizer_model.onnx", module)
    # ORT 1.19.2's Python scheduler swaps its two counts (see README): this warms up over
    # `total_step_count` steps.  Pass them as ORT users do; the numbers match ORT's.
    scheduler = LinearLRScheduler(
        optimizer, warmup_step_count=args.steps, total_step_count=args.steps // 10, initial_lr=0.05
    )

    module.train()
    for step in range(1, args.steps + 1):
        features, labels = synthetic_batch(rng, 64)
        loss = module(features, labels)
        optimizer.step()
        scheduler.step()
        module.lazy_reset_grad()
        if step % 50 == 0 or step == 1:
            print(f"step {step:4d}  loss {float(loss):.4f}  lr {optimizer.get_learning_rate():.5f}")

    module.eval()
    features, labels = synthetic_batch(rng, 512)
    eval_loss = module(features, labels)
    print(f"eval loss {float(eval_loss):.4f}")

    state.properties["epoch"] = 1
    state.properties["note"] = "trained by ort_torch_compat"
    checkpoint = args.out / "checkpoint"
    CheckpointState.save_checkpoint(state, checkpoint, include_optimizer_state=True)
    inference = args.out / "inference.onnx"
    module.export_model_for_inferencing(inference, ["logits"])
    print(f"saved {checkpoint} and {inference}")

    try:
        import onnxruntime
    except ImportError:
        return
    session = onnxruntime.InferenceSession(str(inference), providers=["CPUExecutionProvider"])
    logits = session.run(None, {"features": features})[0]
    print(f"inference accuracy {(logits.argmax(axis=1) == labels).mean():.3f}")


if __name__ == "__main__":
    main()
