"""Train steps as ahead-of-time compiled code, cached on disk.

Why (measured; numbers in docs/design.md): the converted graph runs one torch module per
ONNX node, and its backward one autograd node per aten op, with a kernel launch per
elementwise op.  TorchInductor's C++ code for the same forward and backward fuses the
elementwise chains, folds the shape arithmetic and drops the per-node dispatch: the step
takes about 0.6x the CPU time on the small transformers.  Compiling costs tens of seconds
to minutes (a C++ compiler runs), so the result is cached, and a warm start must stay
cheap: AOTInductor's shared libraries load through `torch._C._aoti` (part of libtorch),
without importing TorchDynamo or TorchInductor (seconds and ~150 MB), in milliseconds.

How: graph/specialize.py turns the converted module into a functional aten graph for the
first batch's shapes; AOTAutograd splits it into a forward graph (which also returns the
activations the backward needs) and a backward graph; AOTInductor compiles each into a
shared library.  At run time one autograd Function calls the two, so gradients reach the
parameters as before (ORT's overwrite/accumulate semantics and the optimizer unchanged),
and new BatchNorm running statistics are copied into the state's tensors after each
forward.  After a cold compile the compiled step is checked once against the module on
the same inputs (any failure leaves the module running eagerly, with one warning) and both
are timed: the compiled step is used only where it is faster (convolution-heavy graphs
such as ResNet-18 gain nothing: their time is in the same oneDNN kernels either way).

When (session options config entry "ort_torch_compat.compile" or ORT_TORCH_COMPAT_COMPILE):
"off"; "on" (compile at the first train step, which waits for it); "auto", the default: use
a cached compilation from the first step on, otherwise start compiling at the first step in
a background process (compile_worker.py) while the steps run eagerly, and switch to the
compiled step between two steps once it is ready, checked and faster.  Ahead of time,
`precompile.py` (`ort-torch-compat compile`) fills the cache.  Only CPU training steps are
compiled; other shapes than the first batch's, eval steps and CUDA run eagerly.
"""
from __future__ import annotations

import base64
import ctypes
import functools
import hashlib
import inspect
import logging
import os
import pathlib
import re
import shutil
import threading
import time
import warnings
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import fx

from . import compile_cache, compile_worker
from .compile_cache import cache_root
from .threads import COMPILING

if TYPE_CHECKING:
    from ..graph.specialize import SpecializedGraph
    from .graph_module import ModuleRecipe


COMPILE_ENV = "ORT_TORCH_COMPAT_COMPILE"
CONFIG_KEY = "ort_torch_compat.compile"  # session options config entry (add_session_config_entry)
SETTINGS = ("off", "on", "auto")
_ALIASES = {"0": "off", "false": "off", "no": "off", "1": "on", "true": "on", "yes": "on"}
_CHECK_RTOL, _CHECK_ATOL, _CHECK_GRAD_RTOL = 1e-3, 1e-5, 0.05
_TIMED_ROUNDS = 5  # eager/compiled step pairs timed after a cold compile
_FASTER = 0.95  # the compiled step is used when it takes at most this share of the eager step's time

log = logging.getLogger("ort_torch_compat.compile")


class CompileWarning(RuntimeWarning):
    """A train step runs without compilation; the message says why."""


def compile_setting(session_options: object = None) -> str:
    """The effective setting: the session options' "ort_torch_compat.compile" config entry,
    else "off" when their graph_optimization_level is ORT_DISABLE_ALL (0), else
    ORT_TORCH_COMPAT_COMPILE, else "auto"."""
    raw = None
    try:
        raw = session_options.get_session_config_entry(CONFIG_KEY)
    except (AttributeError, RuntimeError, KeyError):
        pass
    if raw is None and int(getattr(session_options, "graph_optimization_level", 99)) == 0:
        raw = "off"
    if raw is None:
        raw = os.environ.get(COMPILE_ENV, "auto")
    value = _ALIASES.get(str(raw).strip().lower(), str(raw).strip().lower())
    if value not in SETTINGS:
        raise ValueError(f"compile setting must be one of {SETTINGS} (or 0/1), got {raw!r}")
    return value


def cxx_compiler() -> Optional[str]:
    """The C++ compiler TorchInductor would use, or None."""
    for candidate in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    return None


# ---- cache key ----------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _file_digest(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except OSError:
        return "missing"


def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    flat = tensor.detach().to("cpu").contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


def _stable_repr(value: object) -> str:
    """repr without memory addresses (functions print as `<... at 0x7f...>`)."""
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))


def graph_key(module: fx.GraphModule, tensors: Sequence[torch.Tensor]) -> str:
    """Everything the compiled code depends on, without tracing: torch version, CPU
    capability and instruction-set extensions, the converted graph (code, each module's class, attributes and buffers),
    the source files of those classes and of the compiler path, and the inputs' shapes,
    dtypes and requires_grad flags (parameter values are inputs, not part of the key)."""
    from ..graph import dense_kernel, specialize

    digest = hashlib.sha256()
    digest.update(f"{compile_cache.FORMAT}|{torch.__version__}|{torch.backends.cpu.get_cpu_capability()}".encode())
    digest.update(" ".join(compile_cache.cpu_features()).encode())
    digest.update(module.code.encode())
    sources = {__file__, specialize.__file__, dense_kernel.__file__}
    for name, sub in module.named_modules():
        sources.add(inspect.getsourcefile(type(sub)) or "")
        digest.update(f"{name}|{type(sub).__module__}.{type(sub).__qualname__}".encode())
        for attribute, value in sorted(vars(sub).items()):
            if attribute.startswith("_") or attribute == "training":
                continue
            digest.update(attribute.encode())
            digest.update(_tensor_bytes(value) if isinstance(value, torch.Tensor) else _stable_repr(value).encode())
        for buffer_name, buffer in sub.named_buffers(recurse=False):
            digest.update(f"{buffer_name}|{buffer.dtype}|{tuple(buffer.shape)}".encode())
            digest.update(_tensor_bytes(buffer))
    for path in sorted(sources):
        digest.update(_file_digest(path).encode())
    for tensor in tensors:
        digest.update(f"{tuple(tensor.shape)}|{tensor.dtype}|{tensor.requires_grad}|{tensor.device.type}".encode())
    return digest.hexdigest()[:32]


def _signature(tensors: Sequence[torch.Tensor]) -> Tuple:
    return tuple((tuple(t.shape), t.dtype, t.device) for t in tensors)


# ---- run time -----------------------------------------------------------------------------
def _restride(tensor: torch.Tensor, stride: Tuple[int, ...]) -> torch.Tensor:
    """A copy with the strides the backward library was built for (never expected to run)."""
    return torch.empty_strided(tensor.shape, stride, dtype=tensor.dtype, device=tensor.device).copy_(tensor)


class _CompiledFunction(torch.autograd.Function):
    """Forward library in `forward`, backward library in `backward`."""

    @staticmethod
    def forward(ctx, step: "CompiledTrainStep", *inputs: torch.Tensor):
        outputs = step.forward_library.run(list(inputs))
        results = outputs[: step.num_results]
        ctx.step = step
        ctx.activations = [a if a.stride() == s else _restride(a, s)
                           for a, s in zip(outputs[step.num_results:], step.activation_strides)]
        ctx.mark_non_differentiable(*[r for i, r in enumerate(results) if i not in step.grad_outputs])
        return tuple(results)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        step = ctx.step
        tangents = [grads[i].contiguous() for i in step.grad_outputs]
        results = step.backward_library.run(list(ctx.activations) + tangents)
        ctx.activations = None
        return (None,) + tuple(None if i in step.no_grad_inputs else results[i] for i in range(len(results)))


class CompiledTrainStep:
    """The compiled forward+backward of one graph for one input signature."""

    def __init__(self, directory: pathlib.Path, meta: Dict, constants: List[torch.Tensor]):
        runner = torch._C._aoti.AOTIModelContainerRunnerCpu
        self.forward_library = runner(str(directory / "forward.so"), 1)
        self.backward_library = runner(str(directory / "backward.so"), 1)
        self.num_outputs: int = meta["num_outputs"]
        self.mutated: List[int] = meta["mutated"]
        self.num_results = self.num_outputs + len(self.mutated)
        self.grad_outputs: List[int] = meta["grad_outputs"]
        self.no_grad_inputs = set(meta["no_grad_inputs"])
        self.activation_strides = [tuple(s) for s in meta["activation_strides"]]
        self.constants = constants

    def __call__(self, tensors: Sequence[torch.Tensor]) -> Tuple[torch.Tensor, ...]:
        every = list(tensors) + self.constants
        results = _CompiledFunction.apply(self, *[t.contiguous() for t in every])
        with torch.no_grad():
            for index, value in zip(self.mutated, results[self.num_outputs:]):
                every[index].copy_(value)
        return results[: self.num_outputs]


# ---- compile time ---------------------------------------------------------------------------
def _compile(spec: "SpecializedGraph", tensors: Sequence[torch.Tensor], directory: pathlib.Path) -> Dict:
    """AOTAutograd split + AOTInductor build of `spec` into `directory`; returns the layout."""
    import torch._inductor  # noqa: F401  (heavy: imported only when compiling)
    from ..graph.specialize import NotSpecializable
    from torch._functorch.aot_autograd import aot_function, make_boxed_func
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    captured: Dict[str, Tuple[fx.GraphModule, list]] = {}

    def capture(kind: str):
        def compiler(graph: fx.GraphModule, example_inputs: list):
            captured[kind] = (graph, list(example_inputs))
            return make_boxed_func(graph)

        return compiler

    import torch._inductor.lowering  # noqa: F401  (its decompositions consult the lowerings)
    from torch._inductor.decomposition import select_decomp_table

    # TorchInductor's own decompositions (as torch.compile applies them): the forward and the
    # backward graph then agree on what every saved activation means.
    joint = aot_function(spec.module, fw_compiler=capture("forward"), bw_compiler=capture("backward"),
                         partition_fn=min_cut_rematerialization_partition, decompositions=select_decomp_table())
    args = [t.detach().clone().requires_grad_(t.requires_grad) for t in tensors]
    args += [c.detach().clone() for c in spec.constants]
    results = joint(*args)
    grad_outputs = [i for i, value in enumerate(results) if value.requires_grad]
    if not grad_outputs:
        raise NotSpecializable("no output depends on a trainable parameter")
    torch.autograd.backward([results[i] for i in grad_outputs], [torch.ones_like(results[i]) for i in grad_outputs])
    forward_graph, forward_inputs = captured["forward"]
    backward_graph, backward_inputs = captured["backward"]
    backward_outputs = list(next(n for n in reversed(backward_graph.graph.nodes) if n.op == "output").args[0])
    tangents = [n for n in backward_graph.graph.nodes if n.op == "placeholder" and n.name.startswith("tangents")]
    if len(tangents) != len(grad_outputs):
        raise NotSpecializable(f"backward graph takes {len(tangents)} output gradients, expected {len(grad_outputs)}")
    _build_library(directory, "forward", forward_graph, forward_inputs)
    # The backward library is built for the activations the forward library really returns:
    # the compiler picks their memory layouts (channels-last convolutions...), which the
    # traced graph does not know, and compiled code trusts the strides it was built for.
    forward_library = torch._C._aoti.AOTIModelContainerRunnerCpu(str(directory / "forward.so"), 1)
    with torch.no_grad():
        activations = forward_library.run([a.detach().contiguous() for a in args])[len(results):]
    del forward_library
    tangent_examples = [torch.ones(t.shape, dtype=t.dtype) for t in backward_inputs[len(activations):]]
    _build_library(directory, "backward", backward_graph, activations + tangent_examples)
    for leftover in directory.iterdir():  # generated sources and objects: not needed to load
        if leftover.suffix not in (".so", ".json"):
            shutil.rmtree(leftover) if leftover.is_dir() else leftover.unlink()
        elif leftover.name.startswith("c") and "." in leftover.stem:
            leftover.unlink()
    return {
        "num_outputs": spec.num_outputs,
        "mutated": spec.mutated,
        "grad_outputs": grad_outputs,
        "no_grad_inputs": [i for i, value in enumerate(backward_outputs) if value is None],
        "activation_strides": [list(a.stride()) for a in activations],
    }


def _build_library(directory: pathlib.Path, name: str, graph: fx.GraphModule, example_inputs: list) -> None:
    """AOTInductor: `graph` for these example inputs (shapes and strides) -> directory/name.so."""
    import torch._inductor

    before = set(directory.glob("*.wrapper.json"))
    threads = max(torch.get_num_threads(), os.cpu_count() or 1)
    options = {"aot_inductor.output_path": str(directory / f"{name}.so"), "cpp.dynamic_threads": True,
               "cpp.threads": threads}
    torch._inductor.aot_compile(graph, tuple(example_inputs), options=options)
    # Operators without a C shim run through a proxy executor described by a JSON file,
    # which the runner looks for next to the library, under the library's name.
    for extern in set(directory.glob("*.wrapper.json")) - before:
        shutil.copyfile(extern, directory / f"{name}.json")


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

    def run(function) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
        copies = [t.detach().clone().requires_grad_(t.requires_grad) for t in tensors]
        try:
            with torch.enable_grad():
                outputs = function(copies)
                differentiable = [o for o in outputs if o.requires_grad]
                leaves = [c for c in copies if c.requires_grad]
                grads = torch.autograd.grad(differentiable, leaves, [torch.ones_like(o) for o in differentiable],
                                            allow_unused=True)
            values = [o.detach() for o in outputs] + [c.detach() for c in copies]
            values += [b.detach().clone() for b in module.buffers()]
            return values, [torch.zeros_like(leaf) if g is None else g for g, leaf in zip(grads, leaves)]
        finally:
            with torch.no_grad():
                for buffer, value in zip(module.buffers(), snapshot):
                    buffer.copy_(value)

    (eager_values, eager_grads), (values, grads) = run(lambda copies: module(*copies)), run(step)
    if len(values) != len(eager_values) or len(grads) != len(eager_grads):
        raise NotSpecializable("the compiled step returns other values than the eager step")
    worst = max([_elementwise_excess(c, e) for c, e in zip(values, eager_values)]
                + [_norm_excess(c, e) for c, e in zip(grads, eager_grads)], default=0.0)
    if worst > 0:
        raise NotSpecializable(f"the compiled step disagrees with the eager step (excess difference {worst:.3g})")


def _step_times(step: CompiledTrainStep, module: fx.GraphModule, tensors: Sequence[torch.Tensor]) -> Tuple[float, float]:
    """Median CPU milliseconds of a forward+backward, eager and compiled, interleaved,
    on one thread (CPU time of one thread is the work itself, whatever else the machine runs)."""
    snapshot = [buffer.detach().clone() for buffer in module.buffers()]
    copies = [t.detach().clone().requires_grad_(t.requires_grad) for t in tensors]
    times: Dict[str, List[float]] = {"eager": [], "compiled": []}
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(_TIMED_ROUNDS):
            for kind, function in (("eager", lambda: module(*copies)), ("compiled", lambda: step(copies))):
                begin = time.process_time()
                with torch.enable_grad():
                    outputs = function()
                    differentiable = [o for o in outputs if o.requires_grad]
                    torch.autograd.backward(differentiable, [torch.ones_like(o) for o in differentiable])
                times[kind].append(1000 * (time.process_time() - begin))
                for copy in copies:
                    copy.grad = None
    finally:
        torch.set_num_threads(previous)
        with torch.no_grad():
            for buffer, value in zip(module.buffers(), snapshot):
                buffer.copy_(value)
    return sorted(times["eager"])[len(times["eager"]) // 2], sorted(times["compiled"])[len(times["compiled"]) // 2]


# ---- cache --------------------------------------------------------------------------------
def _encode_tensor(tensor: torch.Tensor) -> Dict:
    """A small constant as JSON (the cache is read without unpickling, like every other file)."""
    return {"dtype": str(tensor.dtype).replace("torch.", ""), "shape": list(tensor.shape),
            "data": base64.b64encode(_tensor_bytes(tensor)).decode("ascii")}


def _decode_tensor(record: Dict) -> torch.Tensor:
    data = bytearray(base64.b64decode(record["data"]))
    flat = torch.frombuffer(data, dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)
    return flat.view(getattr(torch, record["dtype"])).reshape(record["shape"])


def build_entry(module: fx.GraphModule, tensors: Sequence[torch.Tensor], key: str, root: pathlib.Path) -> Dict:
    """Specialize, compile, check and time `module` for `tensors` and publish the entry
    root/key (a refusal is published too, so later runs do not trace again).
    {"status": "compiled" | "refused" | "failed", "reason": ..., "seconds": ...}."""
    from ..graph.specialize import NotSpecializable, lifted_constants, specialize

    begin = time.perf_counter()
    try:
        spec = specialize(module, tensors)

        def build(scratch: pathlib.Path) -> Dict:
            meta = _compile(spec, tensors, scratch)
            trace_constants = spec.constants[len(lifted_constants(module)):]
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


def _check_layout(meta: Dict) -> None:
    """Raise ValueError unless `meta` describes a compiled step (the manifest's digest has
    already caught damage: this catches an entry of another format or a bug)."""
    def integers(value: object) -> bool:
        return isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                               for v in value)

    if not (isinstance(meta.get("num_outputs"), int) and integers(meta.get("mutated"))
            and integers(meta.get("grad_outputs")) and integers(meta.get("no_grad_inputs"))
            and isinstance(meta.get("activation_strides"), list) and all(integers(s) for s in meta["activation_strides"])
            and isinstance(meta.get("trace_constants"), list)
            and all(isinstance(r, dict) and isinstance(r.get("dtype"), str) and integers(r.get("shape"))
                    and isinstance(r.get("data"), str) for r in meta["trace_constants"])
            and all(isinstance(meta.get(k), (int, float)) and not isinstance(meta.get(k), bool)
                    for k in ("eager_ms", "compiled_ms"))
            and {"forward.so", "backward.so"} <= set(meta.get("files", {}))):
        raise ValueError("the manifest does not describe a compiled train step")


def _preload_libraries(directory: pathlib.Path) -> None:
    """dlopen the entry's libraries (kept loaded), so that loading them again is cheap."""
    for name in ("forward.so", "backward.so"):
        try:
            _preloaded.append(ctypes.CDLL(str(directory / name)))
        except OSError:
            return  # the runner's own load reports it


_preloaded: List[object] = []


# ---- policy -------------------------------------------------------------------------------
_reported: set = set()


def _report(label: str, reason: str) -> None:
    """One warning per model and reason per process."""
    if (label, reason) not in _reported:
        _reported.add((label, reason))
        warnings.warn(f"{label}: train steps run without compilation: {reason}", CompileWarning, stacklevel=4)


class TrainStepRunner:
    """Calls the converted train module, or its compiled form when the setting and the cache allow.

    `runner(*feeds, *params)` returns what `module(*feeds, *params)` returns.  `recipe`
    rebuilds the module in the compile worker's process; `eager` (default: the module)
    computes the same as the module and runs the steps that are not compiled (the engine
    passes `graph_module.direct_calls(module)`)."""

    def __init__(self, module: fx.GraphModule, recipe: "ModuleRecipe", device: torch.device,
                 session_options: object = None, eager: Optional[Callable] = None):
        self.module = module
        self.eager = module if eager is None else eager
        self.recipe = recipe
        self.label = recipe.label
        self.setting = compile_setting(session_options)
        self.compiled: Optional[CompiledTrainStep] = None
        self.compile_seconds: Optional[float] = None  # cold compile time, when this process compiled
        self._signature: Optional[Tuple] = None
        self._state = "eager" if self.setting == "off" or device.type != "cpu" else "first"
        self._worker: Optional[compile_worker.CompileWorker] = None
        self._preload: Optional[threading.Thread] = None
        self._entry: Optional[compile_cache.Entry] = None  # verified, being preloaded
        self._started = 0.0
        self._key = ""

    @property
    def path(self) -> str:
        """Which code runs the train step now, for the thread policy: "compiled" or "eager"
        (measured apart), or `threads.COMPILING` (eager, while the worker holds a core)."""
        if self._state in ("compiling", "loading"):
            return COMPILING
        return "compiled" if self._state == "compiled" else "eager"

    def __call__(self, *tensors: torch.Tensor):
        if self._state == "compiled" and _signature(tensors) == self._signature:
            return self.compiled(tensors)
        if self._state == "first":
            self._first(tensors)
        elif self._state == "compiling" and self._worker.done():
            self._finish()
        elif self._state == "loading" and not self._preload.is_alive():
            self._load(*self._entry)  # between two steps: no eager step is in flight
        if self._state == "compiled" and _signature(tensors) == self._signature:
            return self.compiled(tensors)
        return self.eager(*tensors)

    def _first(self, tensors: Sequence[torch.Tensor]) -> None:
        self._signature = _signature(tensors)
        self._state = "eager"
        try:
            self._key = graph_key(self.module, tensors)
        except Exception as error:  # noqa: BLE001  (anything here only means: no compiled step)
            _report(self.label, f"cannot key the compile cache ({type(error).__name__}: {error})")
            return
        entry = self._open_entry()
        if entry is False:
            return
        if entry is not None and "refused" in entry.meta:
            _report(self.label, str(entry.meta["refused"]))
        elif entry is not None:
            self._load(entry.directory, entry.meta)
        else:
            self._start(tensors)

    def _open_entry(self):
        """The verified cache entry of this key, None where there is none (or an untrusted one
        was removed: it is rebuilt), False where the cache cannot be used (reported)."""
        root = cache_root()
        try:
            if os.path.lexists(root):
                compile_cache.check_root(root)
        except compile_cache.CacheProblem as problem:
            _report(self.label, f"{problem}; train steps run eagerly")
            return False
        try:
            return compile_cache.open_entry(root, self._key)
        except compile_cache.CacheProblem as problem:
            if not compile_cache.discard(root, self._key):
                _report(self.label, f"{problem}; train steps run eagerly")
                return False
            _report(self.label, f"{problem}; the entry was removed and is compiled again")
            return None

    def _start(self, tensors: Sequence[torch.Tensor]) -> None:
        """Compile in a child process: in the background under "auto", waited for under "on"."""
        if cxx_compiler() is None:
            _report(self.label, "no C++ compiler found (g++, c++ or clang++; or set CXX)")
            return
        root = cache_root()
        log.info("%s: compiling the train step (cached in %s)", self.label, root)
        self._started = time.perf_counter()
        try:
            self._worker = compile_worker.start(self.recipe, tensors, self._key, root,
                                                background=self.setting == "auto")
        except (OSError, ValueError, TypeError, AttributeError, RuntimeError) as error:  # pickling, spawning
            _report(self.label, f"cannot start the compile worker ({type(error).__name__}: {error})")
            return
        self._state = "compiling"
        if self.setting == "on":
            self._worker.wait()
            self._finish()

    def _finish(self) -> None:
        """Take the finished worker's result: load the entry, or say why there is none."""
        result, self._worker = self._worker.result(), None
        self._state = "eager"
        if result.get("status") != "compiled":
            _report(self.label, str(result.get("reason", "compilation failed")))
            return
        self.compile_seconds = time.perf_counter() - self._started
        log.info("%s: compiled in %.1f s", self.label, self.compile_seconds)
        entry = self._open_entry()
        if not entry or "refused" in entry.meta:
            if entry is None:
                _report(self.label, f"the compiled step vanished from {cache_root() / self._key}")
            return
        if self.setting == "on":
            self._load(*entry)
            return
        # The libraries are mapped and relocated by a thread (ctypes releases the GIL in
        # dlopen); the step that switches over then finds them loaded and pays ~0.1 ms.
        self._entry = entry
        self._preload = threading.Thread(target=_preload_libraries, args=(entry.directory,), daemon=True,
                                         name="ort_torch_compat preload")
        self._preload.start()
        self._state = "loading"

    def _load(self, directory: pathlib.Path, meta: Dict) -> None:
        """Use the entry's compiled step from now on, or stay eager (once: never re-tried per step)."""
        from ..graph.specialize import lifted_constants

        self._state, self._entry = "eager", None
        try:
            _check_layout(meta)
        except ValueError as error:
            _report(self.label, f"cannot load the compiled step from {directory} ({error})")
            return
        if self.setting == "auto" and meta["compiled_ms"] > _FASTER * meta["eager_ms"]:
            log.info("%s: the compiled train step is not faster (%.1f ms vs %.1f ms eager): running eagerly",
                     self.label, meta["compiled_ms"], meta["eager_ms"])
            return
        try:
            spec_constants = lifted_constants(self.module)
            trace_constants = [_decode_tensor(record) for record in meta["trace_constants"]]
            self.compiled = CompiledTrainStep(directory, meta, spec_constants + trace_constants)
            self._state = "compiled"
        except Exception as error:  # noqa: BLE001
            _report(self.label, f"cannot load the compiled step from {directory} ({type(error).__name__}: {error})")
