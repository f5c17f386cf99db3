"""Compiling a train step: specialize, trace, build, check and time; then publish the entry.

graph/specialize.py turns the converted module into a functional aten graph for the first
batch's shapes; make_fx traces that graph's forward together with its autograd backward
into one graph returning the outputs and the gradients (flat, one tensor per dtype), and
AOTInductor compiles it into one shared library.  After the build the compiled step is checked once against the module on
the same inputs (a disagreement refuses the entry) and both are timed: the runner uses the
compiled step only where it is faster (convolution-heavy graphs such as ResNet-18 gain
nothing: their time is in the same oneDNN kernels either way).  Runs in the compile worker
(compile_worker.py) or, ahead of time, in precompile.py.
"""

from __future__ import annotations

import base64
import functools
import os
import pathlib
import shutil
import time
from typing import TYPE_CHECKING, Callable, Dict, List, Sequence, Tuple

import torch
from torch import fx

from . import compile_cache
from .compile_key import tensor_bytes
from .compiled_step import CompiledTrainStep, eager_train_step, gradient_groups

if TYPE_CHECKING:
    from ..graph.specialize import SpecializedGraph

_CHECK_RTOL, _CHECK_ATOL, _CHECK_GRAD_RTOL = 1e-3, 1e-5, 0.05
_TIMED_ROUNDS = 5  # eager/compiled step pairs timed after a cold compile
_POOLED_NODES = 1500  # graphs up to this size get pooled intermediates (see _build_library)


def _compile(spec: "SpecializedGraph", tensors: Sequence[torch.Tensor], directory: pathlib.Path) -> Dict:
    """One AOTInductor library for the whole train step of `spec` (forward, backward of output
    0 seeded with ones, and the gradients) in `directory`; returns the layout.

    The traced graph holds the forward and its autograd backward together, so the compiler
    fuses across them and no activation crosses into Python between the two halves (one call
    per step; measured on the tiny real architectures: the separate forward and backward
    libraries cost 0.07-0.2 ms of Python per step in activation handles and gradient
    bookkeeping, and twice the compile time)."""
    import torch._inductor  # noqa: F401  (heavy: imported only when compiling)
    import torch._inductor.lowering  # noqa: F401  (its decompositions consult the lowerings)
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    from ..graph.index_guard import guard_indices
    from ..graph.specialize import NotSpecializable

    args = [t.detach().clone().requires_grad_(t.requires_grad) for t in tensors]
    args += [c.detach().clone() for c in spec.constants]
    groups = gradient_groups(tensors)
    if not groups:
        raise NotSpecializable("no input of the train step is trainable")

    def whole_step(*inputs: torch.Tensor) -> List[torch.Tensor]:
        with torch.enable_grad():
            results = list(spec.module(*inputs))
            loss = results[0]
            if not loss.requires_grad:
                raise NotSpecializable("the loss (output 0) does not depend on a trainable parameter")
            wanted = [i for group in groups for i in group]
            grads = torch.autograd.grad(loss, [inputs[i] for i in wanted], torch.ones_like(loss), allow_unused=True)
        filled = {i: torch.zeros_like(inputs[i]) if g is None else g for i, g in zip(wanted, grads)}
        flat = [torch.cat([filled[i].reshape(-1) for i in group]) for group in groups]
        return [r.detach() for r in results] + flat

    # TorchInductor's own decompositions (as torch.compile applies them before autograd): the
    # backward is then derived from the decomposed forward, as AOTAutograd derives it.
    graph = make_fx(whole_step, decomposition_table=select_decomp_table(), tracing_mode="fake")(*args)
    index_flag = guard_indices(graph)  # out-of-range indices: a flag, not an abort (graph/index_guard.py)
    _build_library(directory, "step", graph, [a.detach().contiguous() for a in args])
    for leftover in directory.iterdir():  # generated sources and objects: not needed to load
        if leftover.suffix not in (".so", ".json"):
            shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
        elif leftover.name.startswith("c") and "." in leftover.stem:
            leftover.unlink()
    return {"num_outputs": spec.num_outputs, "mutated": spec.mutated, "grad_groups": groups, "index_flag": index_flag}


def _build_library(directory: pathlib.Path, name: str, graph: fx.GraphModule, example_inputs: list) -> None:
    """AOTInductor: `graph` for these example inputs (shapes and strides) -> directory/name.so.

    Intermediates of a graph of at most `_POOLED_NODES` nodes come from one pool allocated
    per call (`memory_planning`) instead of one allocation each: at on-device sizes the
    allocations are a large part of the step (the LSTM-tiny step allocated 90 buffers per
    call; pooled: 3, and the library call went from 0.102 to 0.079 ms, one thread; results
    bit-identical).  Outputs keep their own storage.  Larger graphs (the convolutional
    networks: 2000-5000 nodes, their time in large kernels) gain nothing from it, and
    Inductor's planner recurses past Python's limit on EfficientNet-B0 (5317 nodes); where
    it does so on a smaller graph, the library is built again without pooling."""
    import torch._inductor

    before = set(directory.glob("*.wrapper.json"))
    threads = max(torch.get_num_threads(), os.cpu_count() or 1)
    options = {
        "aot_inductor.output_path": str(directory / f"{name}.so"),
        "cpp.dynamic_threads": True,
        "cpp.threads": threads,
        "memory_planning": len(graph.graph.nodes) <= _POOLED_NODES,
        "memory_pool": "intermediates",
    }
    try:
        torch._inductor.aot_compile(graph, tuple(example_inputs), options=options)
    except Exception as error:  # noqa: BLE001  (Inductor wraps it: InductorError(RecursionError))
        if not options["memory_planning"] or not _caused_by(error, RecursionError):
            raise
        torch._inductor.aot_compile(graph, tuple(example_inputs), options={**options, "memory_planning": False})
    # Operators without a C shim run through a proxy executor described by a JSON file,
    # which the runner looks for next to the library, under the library's name.
    for extern in set(directory.glob("*.wrapper.json")) - before:
        shutil.copyfile(extern, directory / f"{name}.json")


def _caused_by(error: BaseException, kind: type) -> bool:
    """Whether `error` or an exception it was raised from or during is a `kind`."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, kind):
            return True
        seen.add(id(error))
        error = getattr(error, "inner_exception", None) or error.__cause__ or error.__context__
    return False


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


def _self_check(step: CompiledTrainStep, module: fx.GraphModule, tensors: Sequence[torch.Tensor]) -> None:
    """One step both ways on copies of the inputs (the module's buffers restored after each).

    Outputs, updated inputs (running statistics) and buffers must agree elementwise within
    float32 rounding.  Gradients are compared by norm: a ReLU network's gradient jumps where
    an activation is exactly 0, so a rounding-level difference in the forward pass can route
    one element's gradient differently, and BatchNorm's backward spreads that over the
    channel (measured on ResNet-18: up to 3% of a gradient's norm on some batches, 1e-5 on
    others); a wrong wiring or a miscompiled kernel is off by the whole norm."""
    from ..graph.specialize import NotSpecializable

    snapshot = [buffer.detach().clone() for buffer in module.buffers()]

    def run(train: Callable) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
        copies = [t.detach().clone().requires_grad_(t.requires_grad) for t in tensors]
        try:
            outputs = train(copies)
            if outputs is None:  # the compiled step's index flag (the eager step raised first, or disagrees)
                raise RuntimeError("the compiled step found an index out of range in the first batch")
            values = [o.detach() for o in outputs] + [c.detach() for c in copies]
            values += [b.detach().clone() for b in module.buffers()]
            leaves = [c for c in copies if c.requires_grad]
            return values, [torch.zeros_like(leaf) if leaf.grad is None else leaf.grad for leaf in leaves]
        finally:
            with torch.no_grad():
                for buffer, value in zip(module.buffers(), snapshot):
                    buffer.copy_(value)

    (eager_values, eager_grads), (values, grads) = run(functools.partial(eager_train_step, module)), run(step.train)
    if len(values) != len(eager_values) or len(grads) != len(eager_grads):
        raise NotSpecializable("the compiled step returns other values than the eager step")
    worst = max(
        [_elementwise_excess(c, e) for c, e in zip(values, eager_values)]
        + [_norm_excess(c, e) for c, e in zip(grads, eager_grads)],
        default=0.0,
    )
    if worst > 0:
        raise NotSpecializable(f"the compiled step disagrees with the eager step (excess difference {worst:.3g})")


def _step_times(
    step: CompiledTrainStep, module: fx.GraphModule, tensors: Sequence[torch.Tensor]
) -> Tuple[float, float]:
    """Median CPU milliseconds of a train step (forward, backward, gradients into `.grad`),
    eager and compiled, interleaved,
    on one thread (CPU time of one thread is the work itself, whatever else the machine runs)."""
    snapshot = [buffer.detach().clone() for buffer in module.buffers()]
    copies = [t.detach().clone().requires_grad_(t.requires_grad) for t in tensors]
    times: Dict[str, List[float]] = {"eager": [], "compiled": []}
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(_TIMED_ROUNDS):
            for kind, function in (
                ("eager", lambda: eager_train_step(module, copies)),
                ("compiled", lambda: step.train(copies)),
            ):
                begin = time.process_time()
                function()
                times[kind].append(1000 * (time.process_time() - begin))
                for copy in copies:
                    copy.grad = None
    finally:
        torch.set_num_threads(previous)
        with torch.no_grad():
            for buffer, value in zip(module.buffers(), snapshot):
                buffer.copy_(value)
    return sorted(times["eager"])[len(times["eager"]) // 2], sorted(times["compiled"])[len(times["compiled"]) // 2]


def _encode_tensor(tensor: torch.Tensor) -> Dict:
    """A small constant as JSON (the cache is read without unpickling, like every other file)."""
    return {
        "dtype": str(tensor.dtype).replace("torch.", ""),
        "shape": list(tensor.shape),
        "data": base64.b64encode(tensor_bytes(tensor)).decode("ascii"),
    }


def build_entry(module: fx.GraphModule, tensors: Sequence[torch.Tensor], key: str, root: pathlib.Path) -> Dict:
    """Specialize, compile, check and time `module` for `tensors` and publish the entry
    root/key (a refusal is published too, so later runs do not trace again).
    {"status": "compiled" | "refused" | "failed", "reason": ..., "seconds": ...}."""
    from ..graph.specialize import NotSpecializable, lifted_constants, specialize

    begin = time.perf_counter()
    try:
        spec = specialize(module, tensors, convolutions_as_products=True, few_row_products_as_sums=True)

        def build(scratch: pathlib.Path) -> Dict:
            meta = _compile(spec, tensors, scratch)
            trace_constants = spec.constants[len(lifted_constants(module)) :]
            meta["trace_constants"] = [_encode_tensor(constant) for constant in trace_constants]
            step = CompiledTrainStep(scratch, meta, spec.constants)
            _self_check(step, module, tensors)
            meta["eager_ms"], meta["compiled_ms"] = _step_times(step, module, tensors)
            return meta

        compile_cache.publish(root, key, build)
    except NotSpecializable as error:
        reason = str(error)
        try:
            compile_cache.publish(root, key, lambda scratch: {"refused": reason})
        except OSError:
            pass
        return {"status": "refused", "reason": reason}
    except Exception as error:  # noqa: BLE001  (compiler or toolchain failure: the caller trains eagerly)
        first_line = str(error).splitlines()[0][:300] if str(error) else ""
        return {"status": "failed", "reason": f"compilation failed ({type(error).__name__}: {first_line})"}
    return {"status": "compiled", "seconds": time.perf_counter() - begin}
