"""A training script written for onnxruntime-training 1.19.2, unchanged.

It never imports ort_torch_compat.  Run it with ORT:

    python examples/ort_script.py --out /tmp/ort_run

or, without onnxruntime-training installed, on PyTorch:

    ort-torch-compat run examples/ort_script.py --out /tmp/torch_run

Both runs load the checkpoint, train with a linear learning-rate schedule, evaluate,
save a resumable checkpoint, export an inference model, and write the numbers to
`<out>/results.npz` (tests/test_switch.py compares the two).
"""

import argparse
import os
import sys

import numpy as np
import onnxruntime
from onnxruntime.training.api import CheckpointState, LinearLRScheduler, Module, Optimizer

HERE = os.path.dirname(os.path.abspath(__file__))


def batch(rng, size):
    centers = np.array([[-2.0, 0.0], [2.0, 0.0], [0.0, 2.5]], dtype=np.float32)
    labels = rng.integers(0, 3, size=size)
    features = centers[labels] + rng.normal(scale=0.7, size=(size, 2)).astype(np.float32)
    return features.astype(np.float32), labels.astype(np.int64)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--artifacts", default=os.path.join(HERE, "artifacts", "mlp_classifier"))
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--exit-code", type=int, default=0)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rng = np.random.default_rng(7)

    state = CheckpointState.load_checkpoint(os.path.join(args.artifacts, "checkpoint"))
    module = Module(
        os.path.join(args.artifacts, "training_model.onnx"),
        state,
        os.path.join(args.artifacts, "eval_model.onnx"),
        device="cpu",
    )
    optimizer = Optimizer(os.path.join(args.artifacts, "optimizer_model.onnx"), module)
    scheduler = LinearLRScheduler(optimizer, warmup_step_count=args.steps, total_step_count=3, initial_lr=0.05)

    losses, lrs = [], []
    module.train()
    for step in range(args.steps):
        features, labels = batch(rng, 16)
        if step % 2:  # OrtValue inputs work too
            loss = module(
                onnxruntime.OrtValue.ortvalue_from_numpy(features), onnxruntime.OrtValue.ortvalue_from_numpy(labels)
            ).numpy()
        else:
            loss = module(features, labels)
        optimizer.step()
        scheduler.step()
        module.lazy_reset_grad()
        losses.append(float(loss))
        lrs.append(optimizer.get_learning_rate())
        print(f"step {step}: loss {float(loss):.6f} lr {lrs[-1]:.6f}")

    module.eval()
    features, labels = batch(rng, 64)
    eval_loss = float(module(features, labels))
    print(f"eval loss {eval_loss:.6f}")

    state.properties["epoch"] = 1
    state.properties["note"] = "resumable"
    checkpoint = os.path.join(args.out, "checkpoint")
    CheckpointState.save_checkpoint(state, checkpoint, include_optimizer_state=True)
    module.export_model_for_inferencing(os.path.join(args.out, "inference.onnx"), ["logits"])

    reloaded = CheckpointState.load_checkpoint(checkpoint)
    names = sorted(name for name, _ in reloaded.parameters)
    results = {
        "losses": np.array(losses, dtype=np.float64),
        "lrs": np.array(lrs, dtype=np.float64),
        "eval_loss": np.array(eval_loss),
        "contiguous": module.get_contiguous_parameters().numpy(),
        "epoch": np.array(reloaded.properties["epoch"]),
    }
    for name in names:
        results[f"param/{name}"] = reloaded.parameters[name].data
    np.savez(os.path.join(args.out, "results.npz"), **results)
    print(f"saved {checkpoint}; parameters: {', '.join(names)}")
    sys.exit(args.exit_code)


if __name__ == "__main__":
    main()
