"""Fine-tune ORT training artifacts as a plain PyTorch module, then hand the result back to ORT.

    python examples/finetune_native_torch.py [--steps 200] [--out /tmp/ort_torch_compat_finetune]

1. `to_torch_module` turns the artifacts (training model + checkpoint) into a torch.nn.Module
   whose parameters carry the checkpoint's names; frozen parameters have requires_grad=False.
2. Any torch optimizer trains it (here torch.optim.AdamW with gradient clipping, which the
   ORT optimizer artifact cannot express).
3. `module.state_dict()` is an ordinary state dict keyed by checkpoint names: it is saved
   as safetensors, and `ort-torch-compat from-torch` turns it into an ORT checkpoint with the
   original checkpoint's structure, which onnxruntime-training (or ort_torch_compat.api)
   loads to resume training or export.
"""

from __future__ import annotations

import argparse
import pathlib
import tempfile

import numpy as np
import torch
from safetensors.torch import save_file

from ort_torch_compat import to_torch_module
from ort_torch_compat.api import CheckpointState
from ort_torch_compat.cli import main as ort_torch_compat_cli

ARTIFACTS = pathlib.Path(__file__).resolve().parent / "artifacts" / "mlp_classifier"


def synthetic_batch(generator: torch.Generator, size: int):
    centers = torch.tensor([[-2.0, 0.0], [2.0, 0.0], [0.0, 2.5]])
    labels = torch.randint(0, 3, (size,), generator=generator)
    features = centers[labels] + 0.7 * torch.randn(size, 2, generator=generator)
    return features, labels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--artifacts", type=pathlib.Path, default=ARTIFACTS)
    parser.add_argument(
        "--out", type=pathlib.Path, default=pathlib.Path(tempfile.gettempdir()) / "ort_torch_compat_finetune"
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(0)

    # forward(features, labels) -> loss; eval() switches to eval_model.onnx (found next to it).
    model = to_torch_module(args.artifacts / "training_model.onnx", args.artifacts / "checkpoint")
    print(model)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=0.02, weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.steps)

    model.train()
    for step in range(1, args.steps + 1):
        features, labels = synthetic_batch(generator, 64)
        loss = model(features, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, max_norm=1.0)
        optimizer.step()
        optimizer.zero_grad()
        schedule.step()
        if step == 1 or step % 50 == 0:
            print(f"step {step:4d}  loss {loss.item():.4f}")

    model.eval()
    features, labels = synthetic_batch(generator, 512)
    with torch.no_grad():
        print(f"eval loss {model(features, labels).item():.4f}")

    # The same weights in a module that returns the logits (no labels needed).
    classifier = to_torch_module(
        args.artifacts / "training_model.onnx", args.artifacts / "checkpoint", with_loss=False
    ).eval()
    classifier.load_state_dict(model.state_dict())
    with torch.no_grad():
        logits = classifier(features)
    print(f"accuracy {(logits.argmax(dim=1) == labels).float().mean().item():.3f}")

    # Back to ORT: a safetensors state dict, then `ort-torch-compat from-torch`.
    weights = args.out / "finetuned.safetensors"
    save_file({name: tensor.contiguous() for name, tensor in model.state_dict().items()}, str(weights))
    checkpoint = args.out / "checkpoint"
    command = ["from-torch", str(weights), str(args.artifacts / "checkpoint"), str(checkpoint), "--drop-optimizer"]
    print("$ ort-torch-compat " + " ".join(command))
    if ort_torch_compat_cli(command) != 0:
        raise SystemExit(1)
    # (model.save_checkpoint(checkpoint) does the same in one call.)

    state = CheckpointState.load_checkpoint(checkpoint)
    for name, parameter in state.parameters:
        assert np.array_equal(parameter.data, model.state_dict()[name].numpy()), name
    print(
        f"ORT checkpoint {checkpoint} holds the fine-tuned weights "
        f"({len(state.parameters)} parameters); train it further with onnxruntime.training.api"
    )


if __name__ == "__main__":
    main()
