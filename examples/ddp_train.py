"""Data-parallel training of ORT training artifacts with torch.distributed (DDP).

    torchrun --nproc_per_node 2 examples/ddp_train.py --out /tmp/ddp            # CPU, gloo
    torchrun --nproc_per_node 8 examples/ddp_train.py --device cuda --out ...   # GPUs, nccl
    python examples/ddp_train.py --out /tmp/single                              # one process

The artifacts become a plain torch module (`to_torch_module`), wrapped in
DistributedDataParallel, and trained with torch.optim.SGD.  Every step draws one global
batch (the same on every rank, from the step number) and each rank trains on its slice;
DDP averages the gradients, so N processes compute exactly the update one process makes on
the whole batch (tests/test_ddp.py checks it).  Rank 0 writes an ORT checkpoint with the
artifacts' structure (`<out>/checkpoint`, loadable by onnxruntime-training) and the
per-step losses (`<out>/losses.npy`).
"""

from __future__ import annotations

import argparse
import gc
import os
import pathlib
from typing import List, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist

# torch.distributed.nn is imported before init_process_group on purpose (torch 2.14.1): its
# functions take `group=group.WORLD` as a default argument, evaluated at import time. Imported
# after init_process_group (DDP's constructor does it, lazily, through torch._dynamo), they would
# hold the default process group until exit, and shutdown_distributed() could not free it.
import torch.distributed.nn  # noqa: F401
from torch.nn.parallel import DistributedDataParallel

from ort_torch_compat import to_torch_module

ARTIFACTS = pathlib.Path(__file__).resolve().parent / "artifacts" / "mlp_classifier"


def global_batch(step: int, size: int, seed: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    """The step's whole batch; every rank computes the same one and takes its slice."""
    generator = torch.Generator().manual_seed(seed * 100_003 + step)
    centers = torch.tensor([[-2.0, 0.0], [2.0, 0.0], [0.0, 2.5]])
    labels = torch.randint(0, 3, (size,), generator=generator)
    features = centers[labels] + 0.7 * torch.randn(size, 2, generator=generator)
    return features, labels


def train(
    artifacts: pathlib.Path,
    *,
    steps: int,
    global_batch_size: int,
    lr: float,
    seed: int = 0,
    device: str = "cpu",
    rank: int = 0,
    world_size: int = 1,
    log: bool = False,
):
    """Train and return (the unwrapped module, per-step global losses)."""
    if global_batch_size % world_size:
        raise ValueError(f"--global-batch {global_batch_size} is not divisible by the {world_size} processes")
    local = global_batch_size // world_size
    module = to_torch_module(artifacts / "training_model.onnx", artifacts / "checkpoint").to(device)
    model = module
    if dist.is_available() and dist.is_initialized():
        model = DistributedDataParallel(module, device_ids=[torch.device(device).index] if device != "cpu" else None)
    optimizer = torch.optim.SGD([p for p in module.parameters() if p.requires_grad], lr=lr)
    losses: List[float] = []
    model.train()
    for step in range(steps):
        features, labels = global_batch(step, global_batch_size, seed)
        x = features[rank * local : (rank + 1) * local].to(device)
        y = labels[rank * local : (rank + 1) * local].to(device)
        loss = model(x, y)
        loss.backward()  # DDP all-reduces (averages) the gradients here
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        reported = loss.detach().clone()
        if model is not module:
            dist.all_reduce(reported)
            reported /= world_size
        losses.append(reported.item())
        if log and rank == 0 and (step % 10 == 0 or step == steps - 1):
            print(f"step {step:4d}  loss {losses[-1]:.5f}  (world size {world_size})", flush=True)
    return module, losses


def shutdown_distributed() -> None:
    """Free the process group now, so that its worker threads end before Python shuts down.

    Works around a teardown race in torch 2.14.1 that aborted rank 1 with SIGABRT ("terminate
    called without an active exception") about once in 40 runs on a loaded 2-core machine.  A gloo
    worker thread frees a finished collective only after it has woken the caller; and a barrier
    holds weak references to the collectives before it, so the last loss all-reduce is freed when
    the worker drops the barrier.  Freeing the tensor of that all-reduce, created in Python, takes
    the GIL.  If the main thread has reached interpreter shutdown by then, CPython ends the worker
    thread inside a noexcept destructor, and C++ calls std::terminate.

    destroy_process_group() alone does not help: it only drops references, and the gloo group
    joins its threads (with the GIL released, so they can finish) when its last reference goes.
    Two other holders must be gone by then: the DDP wrapper, which sits in a reference cycle
    (its reducer holds the group), and torch.distributed.nn's default arguments (see its import).
    """
    dist.barrier()  # every rank has finished its collectives before any rank disconnects
    gc.collect()  # frees the DDP wrapper (reference cycle) and with it the reducer's group reference
    dist.destroy_process_group()  # drops the last reference: gloo joins its worker threads here


def main(argv: Optional[List[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--artifacts", type=pathlib.Path, default=ARTIFACTS)
    parser.add_argument("--out", type=pathlib.Path, required=True)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args(argv)

    distributed = "RANK" in os.environ and "WORLD_SIZE" in os.environ  # launched by torchrun
    world_size = int(os.environ.get("WORLD_SIZE", "1")) if distributed else 1
    rank = int(os.environ.get("RANK", "0")) if distributed else 0
    device = "cpu"
    if args.device == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        device = f"cuda:{local_rank}"
    if distributed:
        dist.init_process_group(backend="nccl" if args.device == "cuda" else "gloo")

    try:
        module, losses = train(
            args.artifacts,
            steps=args.steps,
            global_batch_size=args.global_batch,
            lr=args.lr,
            seed=args.seed,
            device=device,
            rank=rank,
            world_size=world_size,
            log=True,
        )
        if rank == 0:
            args.out.mkdir(parents=True, exist_ok=True)
            module.save_checkpoint(args.out / "checkpoint")  # ORT checkpoint, the artifacts' structure
            np.save(args.out / "losses.npy", np.array(losses, dtype=np.float64))
            print(f"rank 0 wrote {args.out / 'checkpoint'}", flush=True)
    finally:
        if distributed:
            shutdown_distributed()


if __name__ == "__main__":
    main()
