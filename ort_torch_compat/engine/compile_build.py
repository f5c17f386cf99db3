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
import contextlib
import os
import pathlib
import shutil
import time
from typing import TYPE_CHECKING, Dict, Iterator, Sequence

import torch
from torch import fx

from . import compile_cache
from .compile_key import tensor_bytes
from .compiled_step import CompiledTrainStep, gradient_groups
from .joint_graph import joint_train_graph
from .step_check import check_against_eager, time_against_eager

if TYPE_CHECKING:
    from ..graph.specialize import SpecializedGraph

_TIMED_ROUNDS = 5  # eager/compiled step pairs timed after a cold compile
_POOLED_NODES = 1500  # graphs up to this size get pooled intermediates (see _build_library)
_PARALLEL_ELEMENTS = 32768  # a kernel is split over threads from this much work on (ATen's grain size)


# What compiling imports, heavy and lazily (several seconds): a compile worker imports them
# while its parent still traces the first step (`import_compiler`).
_COMPILER_MODULES = (
    "torch._inductor.lowering",
    "torch._inductor.decomposition",
    "torch._inductor.compile_fx",
    "torch._inductor.scheduler",
    "torch._inductor.codecache",
    "torch._inductor.cpp_builder",
    "torch._inductor.codegen.cpp",
    "torch._inductor.codegen.cpp_wrapper_cpu",
    "torch._functorch.aot_autograd",
)


def import_compiler() -> None:
    """Import TorchInductor's modules that compiling needs (those this torch has)."""
    import importlib

    for name in _COMPILER_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:  # another torch lays them out otherwise: imported when used
            pass


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

    from ..graph.index_guard import guard_indices

    # TorchInductor's own decompositions (as torch.compile applies them before autograd): the
    # backward is then derived from the decomposed forward, as AOTAutograd derives it.
    graph = joint_train_graph(spec, tensors, select_decomp_table())
    index_flag = guard_indices(graph)  # out-of-range indices: a flag, not an abort (graph/index_guard.py)
    example = [t.detach().contiguous() for t in list(tensors) + list(spec.constants)]
    _build_library(directory, "step", graph, example)
    for leftover in directory.iterdir():  # generated sources and objects: not needed to load
        if leftover.suffix not in (".so", ".json"):
            shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
        elif leftover.name.startswith("c") and "." in leftover.stem:
            leftover.unlink()
    return {
        "num_outputs": spec.num_outputs,
        "mutated": spec.mutated,
        "grad_groups": gradient_groups(tensors),
        "index_flag": index_flag,
    }


def _build_library(directory: pathlib.Path, name: str, graph: fx.GraphModule, example_inputs: list) -> None:
    """AOTInductor: `graph` for these example inputs (shapes and strides) -> directory/name.so.

    Intermediates of a graph of at most `_POOLED_NODES` nodes come from one pool allocated
    per call (`memory_planning`) instead of one allocation each: at on-device sizes the
    allocations are a large part of the step (the LSTM-tiny step allocated 90 buffers per
    call; pooled: 3, and the library call went from 0.102 to 0.079 ms, one thread; results
    bit-identical).  Outputs keep their own storage.  Larger graphs (the convolutional
    networks: 2000-5000 nodes, their time in large kernels) gain nothing from it, and
    Inductor's planner recurses past Python's limit on EfficientNet-B0 (5317 nodes); where
    it does so on a smaller graph, the library is built again without pooling.

    Kernels run on the thread count of the call (`cpp.dynamic_threads`); one is split over
    threads only from `_PARALLEL_ELEMENTS` of work on, the smaller ones have no OpenMP
    region at all (`_small_kernels_serial`).

    Without line tables (`aot_inductor.enable_line_tables`, g++'s `-g1`): nothing reads
    the library's debug information, and writing it took 1.5-2 s of the wrapper's 9.4-10 s
    (LoRA-tiny, AVX2-only AMD host, docs/performance.md)."""
    import torch._inductor
    import torch._inductor.config as inductor_config

    before = set(directory.glob("*.wrapper.json"))
    threads = max(torch.get_num_threads(), os.cpu_count() or 1)
    options = {
        "aot_inductor.output_path": str(directory / f"{name}.so"),
        "cpp.dynamic_threads": True,
        "cpp.threads": threads,
        "memory_planning": len(graph.graph.nodes) <= _POOLED_NODES,
        "memory_pool": "intermediates",
    }
    if hasattr(inductor_config.cpp, "min_chunk_size"):
        options["cpp.min_chunk_size"] = max(1, _PARALLEL_ELEMENTS // threads)
    if hasattr(inductor_config.aot_inductor, "enable_line_tables"):
        options["aot_inductor.enable_line_tables"] = False  # no `-g1`: see above
    with _small_kernels_serial():
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


@contextlib.contextmanager
def _small_kernels_serial() -> Iterator[None]:
    """Inductor's C++ kernels, built with `cpp.dynamic_threads` (the thread count read at
    run time, so the thread policy's choice holds), each get an OpenMP parallel region
    however little work they do: Inductor lets the OpenMP runtime run small ones on one
    thread.  But libgomp's team barrier ends with a futex wake even for a team of one,
    so every kernel cost a system call or two a step: LoRA-tiny's compiled step made 44
    a step, and its whole loop step took 0.126-0.140 ms on one thread against 0.100-0.101
    without the regions (docs/performance.md).  Here a kernel gets its parallel region only where its
    work reaches `cpp.min_chunk_size` per thread, as without dynamic threads: Inductor's
    own decision, taken with `cpp.dynamic_threads` off (the regions it keeps still read
    the thread count at run time).  A torch without that method compiles as it would."""
    import torch._inductor.config as inductor_config

    try:
        from torch._inductor.codegen.cpp import CppKernel
    except ImportError:  # pragma: no cover  (a torch whose C++ backend is laid out otherwise)
        yield
        return
    decide = CppKernel.__dict__.get("decide_parallel_depth")
    if decide is None:  # pragma: no cover
        yield
        return

    def decide_without_dynamic_threads(self, *args, **kwargs):
        with inductor_config.patch({"cpp.dynamic_threads": False}):
            return decide(self, *args, **kwargs)

    CppKernel.decide_parallel_depth = decide_without_dynamic_threads
    try:
        yield
    finally:
        CppKernel.decide_parallel_depth = decide


def _caused_by(error: BaseException, kind: type) -> bool:
    """Whether `error` or an exception it was raised from or during is a `kind`."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, kind):
            return True
        seen.add(id(error))
        error = getattr(error, "inner_exception", None) or error.__cause__ or error.__context__
    return False


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
        spec = specialize(
            module, tensors, convolutions_as_products=True, few_row_products_as_sums=True, bias_adds_unfused=True
        )

        def build(scratch: pathlib.Path) -> Dict:
            meta = _compile(spec, tensors, scratch)
            trace_constants = spec.constants[len(lifted_constants(module)) :]
            meta["trace_constants"] = [_encode_tensor(constant) for constant in trace_constants]
            step = CompiledTrainStep(scratch, meta, spec.constants)
            check_against_eager(step, module, tensors)
            meta["eager_ms"], meta["compiled_ms"] = time_against_eager(step, module, tensors, _TIMED_ROUNDS)
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
