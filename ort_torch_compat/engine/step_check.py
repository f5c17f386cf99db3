"""Checking and timing a train step without autograd against the eager step it replaces.

A compiled library (compile_build.py) or a traced step (traced_step.py) is used only after
one step both ways on the same inputs agreed (`check_against_eager`), and, where the
runner asks, only where it is faster (`time_against_eager`).  Both run on copies of the
inputs; the module's buffers and torch's CPU random generator are left as they were, and
both step forms draw the same random numbers (a dropout mask is compared, not re-drawn).
"""

from __future__ import annotations

import contextlib
import functools
import time
from typing import Callable, Iterator, List, Sequence, Tuple

import torch
from torch import fx

from .compiled_step import eager_train_step

_CHECK_RTOL, _CHECK_ATOL, _CHECK_GRAD_RTOL = 1e-3, 1e-5, 0.05
_TIMING_BUDGET_S = 0.5


def _elementwise_excess(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Excess of max |actual - expected| over 1e-5 + 1e-3*max|expected| (<= 0: within)."""
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return float("inf")
    if not expected.dtype.is_floating_point:
        return 0.0 if torch.equal(actual, expected) else float("inf")
    if not expected.numel():
        return 0.0
    scale = expected.abs().max().item()
    return (actual - expected).abs().max().item() - (_CHECK_ATOL + _CHECK_RTOL * scale)


def _norm_excess(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Excess of ||actual - expected|| over 5% of ||expected|| (plus 1e-5 per element)."""
    if actual.shape != expected.shape:
        return float("inf")
    tolerance = _CHECK_GRAD_RTOL * expected.norm().item() + _CHECK_ATOL * expected.numel() ** 0.5
    return (actual - expected).norm().item() - tolerance


@contextlib.contextmanager
def _untouched(module: fx.GraphModule) -> Iterator[Callable[[], None]]:
    """Yields `reset`, which puts the module's buffers and the CPU generator back as they
    were on entry; they are put back on exit too."""
    buffers = [buffer.detach().clone() for buffer in module.buffers()]
    generator = torch.get_rng_state()

    def reset() -> None:
        with torch.no_grad():
            for buffer, value in zip(module.buffers(), buffers):
                buffer.copy_(value)
        torch.set_rng_state(generator)

    try:
        yield reset
    finally:
        reset()


def check_against_eager(step, module: fx.GraphModule, tensors: Sequence[torch.Tensor], runs: int = 1) -> None:
    """One step of the eager `module` and `runs` of `step` (its `train`), each on fresh
    copies of `tensors` from the same state (a runtime that plans its memory on its first
    runs, traced_step.py's Static Runtime, is checked past them).

    Outputs, updated inputs (running statistics) and buffers must agree elementwise within
    float32 rounding.  Gradients are compared by norm: a ReLU network's gradient jumps where
    an activation is exactly 0, so a rounding-level difference in the forward pass can route
    one element's gradient differently, and BatchNorm's backward spreads that over the
    channel (measured on ResNet-18: up to 3% of a gradient's norm on some batches, 1e-5 on
    others); a wrong wiring or a miscompiled kernel is off by the whole norm.  Raises
    NotSpecializable with the largest excess."""
    from ..graph.specialize import NotSpecializable

    def run(train: Callable, reset: Callable[[], None]) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
        reset()
        copies = [t.detach().clone().requires_grad_(t.requires_grad) for t in tensors]
        outputs = train(copies)
        if outputs is None:  # the compiled step's index flag (the eager step raised first, or disagrees)
            error = getattr(step, "error", None)  # a traced step's: what its graph raised
            if error is not None:
                raise NotSpecializable(f"the step raised {type(error).__name__}: {str(error).splitlines()[0][:200]}")
            raise RuntimeError("the compiled step found an index out of range in the first batch")
        values = [o.detach() for o in outputs] + [c.detach() for c in copies]
        values += [b.detach().clone() for b in module.buffers()]
        leaves = [c for c in copies if c.requires_grad]
        return values, [torch.zeros_like(leaf) if leaf.grad is None else leaf.grad for leaf in leaves]

    with _untouched(module) as reset:
        eager_values, eager_grads = run(functools.partial(eager_train_step, module), reset)
        for _ in range(runs):
            values, grads = run(step.train, reset)
            if len(values) != len(eager_values) or len(grads) != len(eager_grads):
                raise NotSpecializable("the compiled step returns other values than the eager step")
            worst = max(
                [_elementwise_excess(c, e) for c, e in zip(values, eager_values)]
                + [_norm_excess(c, e) for c, e in zip(grads, eager_grads)],
                default=0.0,
            )
            if worst > 0:
                raise NotSpecializable(
                    f"the compiled step disagrees with the eager step (excess difference {worst:.3g})"
                )


def time_against_eager(
    step, module: fx.GraphModule, tensors: Sequence[torch.Tensor], rounds: int
) -> Tuple[float, float]:
    """Least CPU milliseconds of a train step (forward, backward, gradients into `.grad`),
    eager and by `step`, `rounds` of each interleaved (see `time_steps`)."""
    eager_ms, step_ms = time_steps(module, tensors, [step], rounds)
    return eager_ms, step_ms


def time_steps(module: fx.GraphModule, tensors: Sequence[torch.Tensor], steps: Sequence, rounds: int) -> List[float]:
    """Least CPU milliseconds of a train step (forward, backward, gradients into `.grad`):
    eager, then by each of `steps`; `rounds` of each, interleaved (a load that comes and
    goes weighs on all alike), each timed step right after an untimed one of its own (as
    in a training loop: its data in the caches, TorchScript's executor warm; measured on
    LoRA-tiny, a step right after an eager one takes 1.5x as long), on one thread (the
    calling thread's CPU time is the work itself, whatever else the machine runs).  The
    least, not the median: interruptions and cache misses from other processes only add
    time (on a noisy machine, medians of 3 chose oneDNN's GELU for LoRA-tiny in 1 run of 3
    though ATen's is 20% faster).  Rounds after the first only while the timing has taken
    less than `_TIMING_BUDGET_S` (ResNet-18-tiny: 6 steps of 60-100 ms a round)."""
    trains: List[Callable] = [functools.partial(eager_train_step, module)] + [step.train for step in steps]
    return _least_cpu_ms(module, tensors, trains, rounds)


def time_runs(module: fx.GraphModule, tensors: Sequence[torch.Tensor], steps: Sequence, rounds: int) -> List[float]:
    """Least CPU milliseconds of each of `steps`' `run` (outputs and flat gradients, as the
    engine calls it; no eager step, no `.grad` written), timed as `time_steps` times: for
    choosing between two forms of one step, whose difference the per-parameter gradient
    copies of `train` would dilute."""
    return _least_cpu_ms(module, tensors, [step.run for step in steps], rounds)


def _least_cpu_ms(
    module: fx.GraphModule, tensors: Sequence[torch.Tensor], calls: Sequence[Callable], rounds: int
) -> List[float]:
    """Least CPU milliseconds of each of `calls` on copies of `tensors` (see `time_steps`)."""
    copies = [t.detach().clone().requires_grad_(t.requires_grad) for t in tensors]
    times: List[List[float]] = [[] for _ in calls]
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    started = time.perf_counter()
    try:
        with _untouched(module):
            for round_ in range(rounds):
                if round_ and time.perf_counter() - started > _TIMING_BUDGET_S:
                    break  # long steps: one round says enough, and each costs the user's first step
                for call, samples in zip(calls, times):
                    for timed in (False, True):
                        begin = time.thread_time()
                        call(copies)
                        if timed:
                            samples.append(1000 * (time.thread_time() - begin))
                        for copy in copies:
                            copy.grad = None
    finally:
        torch.set_num_threads(previous)
    return [min(samples) for samples in times]
