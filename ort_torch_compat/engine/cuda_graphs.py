"""A whole train step per launch on CUDA: the train step and the optimizer step as CUDA graphs.

Why: at on-device and benchmark sizes a CUDA step is bound by the host, not the GPU.  The
converted graph launches one or more kernels per ONNX node, and autograd one or more per
backward op, each launch costing microseconds of Python and driver time while the GPU idles
(measured on an H200: CPU time per step equal to wall time, no faster than hand-written
eager PyTorch).  A CUDA graph records the kernels of one step once and replays them with one
launch.

What is captured, per input signature (shapes and dtypes of the feeds):
- the train step: forward, `torch.autograd.grad` of output 0 (seeded as the eager step
  seeds it) and the write of the gradients into the store's persistent flat gradient
  buffers (`ParameterStore.bind_flat_grads`), in two variants sharing one memory pool:
  "overwrite" (the first step after `lazy_reset_grad`, ORT's overwrite) and "accumulate"
  (later steps add).  The feeds are copied into static input buffers before each replay and
  the outputs cloned out after it, so a returned loss is never overwritten by a later step;
- the optimizer step (optimizer_graphs.py): ORT's AdamW or SGD formula over the flat
  parameter, gradient and moment buffers, its step-dependent scalars (learning rate, bias
  corrections) fed through a small device tensor, so learning-rate changes and schedulers
  take effect at the next replay.

When: a signature's first train step runs the very code that is captured, eagerly, on the
capture stream (warming up cuBLAS/cuDNN handles and lazily loaded kernels, as CUDA graph
capture requires); its second step captures and replays; later steps replay.  Random ops
(Dropout) draw from torch's CUDA generator, whose graph-safe state gives each replay the
numbers the eager step would have drawn.  BatchNorm running statistics are updated in place
by the replay, as by the eager step.  Where capture cannot hold (a host-side read of device
data such as `.item()` or a data-dependent shape, which a CUDA stream cannot record), the
signature runs eagerly from then on and the log says why, once.  At most `MAX_SIGNATURES`
signatures are captured per engine (each keeps its own activations).

Setting: the session options config entry "ort_torch_compat.cuda_graphs" or the environment
variable ORT_TORCH_COMPAT_CUDA_GRAPHS: "1" (default) or "0".  CPU engines never use graphs.
"""

from __future__ import annotations

import logging
import os
import pathlib
import sys
import traceback
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from .parameter_store import ParameterStore

CONFIG_KEY = "ort_torch_compat.cuda_graphs"  # session options config entry (add_session_config_entry)
GRAPHS_ENV = "ORT_TORCH_COMPAT_CUDA_GRAPHS"
MAX_SIGNATURES = 4
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")

log = logging.getLogger("ort_torch_compat.cuda_graphs")
_reported: set = set()


def refusal_reason(what: str, error: BaseException) -> str:
    """`what (ErrorType: first line of the message) at file:line in function`, the place being
    the innermost frame of the library's or onnx2torch's code (the converter that failed)."""
    roots = [pathlib.Path(__file__).resolve().parents[1]]  # this package
    onnx2torch = sys.modules.get("onnx2torch")
    if onnx2torch is not None and getattr(onnx2torch, "__file__", None):
        roots.append(pathlib.Path(onnx2torch.__file__).resolve().parent)
    where = ""
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        path = pathlib.Path(frame.filename).resolve()
        root = next((r for r in roots if r == path or r in path.parents), None)
        if root is not None:
            relative = path.relative_to(root.parent).as_posix()
            where = f" at {relative}:{frame.lineno} in {frame.name}"
            break
    return f"{what} ({type(error).__name__}: {(str(error).splitlines() or [''])[0]}){where}"


def report_once(label: str, reason: str) -> None:
    """Log (warning level) why `label`'s steps run eagerly, once per process and reason."""
    if (label, reason) not in _reported:
        _reported.add((label, reason))
        log.warning("%s: CUDA graphs not used, steps run eagerly: %s", label, reason)


def graphs_enabled(device: torch.device, session_options: object = None) -> bool:
    """Whether an engine on `device` captures its steps as CUDA graphs: only on CUDA, and
    unless the config entry (first) or the environment variable says "0"."""
    if device.type != "cuda":
        return False
    raw = None
    try:
        raw = session_options.get_session_config_entry(CONFIG_KEY)
    except (AttributeError, RuntimeError, KeyError):
        pass
    if raw is None:
        raw = os.environ.get(GRAPHS_ENV, "1")
    value = str(raw).strip().lower()
    if value not in _TRUE + _FALSE:
        raise ValueError(f"{CONFIG_KEY} / {GRAPHS_ENV} must be '1' or '0', got {raw!r}")
    return value in _TRUE


class CudaGraphRecorder:
    """One CUDA graph: `capture(body)` records what `body()` launches on `stream` (returning
    its result, whose tensors live in the graph's memory pool), `replay()` launches it."""

    def __init__(self, pool: Tuple, stream: "torch.cuda.Stream"):
        self.graph = torch.cuda.CUDAGraph()
        self.pool, self.stream = pool, stream

    def capture(self, body: Callable[[], object]) -> object:
        with torch.cuda.graph(self.graph, pool=self.pool, stream=self.stream):
            return body()

    def replay(self) -> None:
        self.graph.replay()


class DeviceStream:
    """The capture stream of an engine, and the memory pool its graphs share (graphs of one
    engine never replay concurrently, and every result is copied out right after a replay)."""

    def __init__(self, device: torch.device):
        self.stream = torch.cuda.Stream(device=device)
        self.pool = torch.cuda.graph_pool_handle()

    def recorder(self) -> CudaGraphRecorder:
        return CudaGraphRecorder(self.pool, self.stream)

    def staging(self, device_tensor: torch.Tensor) -> "ScalarStaging":
        """A way to copy per-step scalars from the host into `device_tensor` (see ScalarStaging)."""
        return ScalarStaging(device_tensor)

    def run(self, body: Callable[[], object]) -> object:
        """`body()` executed (not captured) on the capture stream, ordered with the caller's stream."""
        current = torch.cuda.current_stream(self.stream.device)
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream):
            result = body()
        current.wait_stream(self.stream)
        return result


class ScalarStaging:
    """Host-to-device copies of a few float32 scalars per step without a synchronization:
    a ring of pinned buffers, each reused only after the copy that read it has run."""

    SLOTS = 4

    def __init__(self, device_tensor: torch.Tensor):
        self.device_tensor = device_tensor
        self.slots = [torch.empty(device_tensor.shape, dtype=torch.float32).pin_memory() for _ in range(self.SLOTS)]
        self.events = [torch.cuda.Event() for _ in range(self.SLOTS)]
        self.used = [False] * self.SLOTS
        self.next = 0

    def send(self, values: Sequence[float]) -> None:
        """Copy `values` into the device tensor, ordered before what the stream does next."""
        index, self.next = self.next, (self.next + 1) % self.SLOTS
        if self.used[index]:
            self.events[index].synchronize()
        self.slots[index].numpy()[:] = values
        self.device_tensor.copy_(self.slots[index], non_blocking=True)
        self.events[index].record()
        self.used[index] = True


class _Signature:
    """The captured train steps of one input signature: static feeds and, per variant
    ("accumulate" True/False), the recorder, the outputs and this step's gradients."""

    def __init__(self, feeds: Sequence[torch.Tensor], function: Callable):
        self.feeds = [torch.empty_like(t) for t in feeds]
        self.function = function
        self.recorders: Dict[bool, CudaGraphRecorder] = {}
        self.results: Dict[bool, Tuple[List[torch.Tensor], List[Optional[torch.Tensor]]]] = {}


class TrainStepGraphs:
    """The train steps of one engine as CUDA graphs (see the module docstring).

    `function(*feeds, *params)` is the eager train module; `params` the tensors the engine
    feeds it after the user feeds; `store` owns the trainable parameters and the flat
    gradient buffers the graphs write.  `streams` makes the recorders (tests substitute one
    that re-runs the body)."""

    def __init__(
        self,
        module: torch.nn.Module,
        function: Callable,
        params: Sequence[torch.Tensor],
        store: ParameterStore,
        label: str,
        streams: "DeviceStream",
    ):
        self.module, self.function, self.params, self.store = module, function, list(params), store
        self.label = label
        self.streams = streams
        self.trainable = list(store.trainable)
        self._signatures: Dict[Tuple, Optional[_Signature]] = {}  # None: refused (eager)
        self.refusals: List[str] = []  # why signatures run eagerly, in order
        self._warm: set = set()  # (signature key, variant) run once, ready to capture

    # ---- what one step runs -------------------------------------------------------------
    def _body(self, entry: _Signature, accumulate: bool):
        """Forward, gradients of output 0, and their write into the flat gradient buffers."""
        views = self.store.flat_grad_views()
        with torch.enable_grad():
            outputs = entry.function(*entry.feeds, *self.params)
            loss = outputs[0]
            if loss.requires_grad:
                seed = torch.ones_like(loss) if loss.dim() else None
                grads = torch.autograd.grad(loss, self.trainable, grad_outputs=seed, allow_unused=True)
            else:
                grads = (None,) * len(self.trainable)
        with torch.no_grad():
            reached = [(view, grad) for view, grad in zip(views, grads) if grad is not None]
            if accumulate and reached:
                torch._foreach_add_([v for v, _ in reached], [g for _, g in reached])
            elif not accumulate:
                if reached:
                    torch._foreach_copy_([v for v, _ in reached], [g for _, g in reached])
                missed = [view for view, grad in zip(views, grads) if grad is None]
                if missed:
                    torch._foreach_zero_(missed)
        return [out.detach() for out in outputs], list(grads)

    # ---- the step ---------------------------------------------------------------------------
    def train_step(
        self,
        feeds: Sequence[torch.Tensor],
        accumulate: bool,
        observe: Optional[Callable[[torch.Tensor, torch.Tensor], None]] = None,
    ) -> Optional[List[torch.Tensor]]:
        """One train step on `feeds`: the outputs, with the gradients written into the flat
        buffers and bound as `.grad`.  The first step of a signature (and variant) runs the
        recorded code eagerly, later ones replay the graph.  None where the engine's eager
        path must run the step: a signature whose recording failed, or one too many."""
        key = tuple((tuple(t.shape), t.dtype) for t in feeds)
        entry = self._signatures.get(key, False)
        if entry is None:
            return None
        if entry is False:
            if len(self._signatures) >= MAX_SIGNATURES:
                report_once(self.label, f"more than {MAX_SIGNATURES} input signatures; new ones run eagerly")
                return None
            entry = self._signatures[key] = _Signature(feeds, self._specialized(feeds))
        if accumulate:
            self.store.bind_flat_grads(copy=True)  # keeps gradients an eager step left behind
        torch._foreach_copy_(entry.feeds, list(feeds))
        variant = (key, accumulate)
        if variant not in self._warm:  # the eager run of exactly what is captured next time
            outputs, grads = self.streams.run(lambda: self._body(entry, accumulate))
            self._warm.add(variant)
        else:
            if accumulate not in entry.recorders and not self._capture(key, entry, accumulate):
                return None
            entry.recorders[accumulate].replay()
            outputs, grads = entry.results[accumulate]
            outputs = [out.clone() for out in outputs]
        self.store.bind_flat_grads(copy=False)
        if observe is not None:
            for tensor, grad in zip(self.trainable, grads):
                if grad is not None:
                    observe(tensor, grad)
        return outputs

    @property
    def replaying(self) -> bool:
        """Whether some input signature's train step is replayed as a CUDA graph."""
        return any(entry is not None and bool(entry.recorders) for entry in self._signatures.values())

    def _specialized(self, feeds: Sequence[torch.Tensor]) -> Callable:
        """The train module specialized to these feeds' shapes (graph/specialize.py): aten
        calls only, shape arithmetic folded into constants, so no step reads a shape back
        from the device (which a CUDA stream cannot record).  Running-statistic updates are
        copied into the live tensors as the module does in place.  Where the graph cannot be
        specialized (data-dependent control flow), the module itself."""
        from ..graph.specialize import specialize

        tensors = [*feeds, *self.params]
        try:
            spec = specialize(self.module, tensors, allow_random=True, fold_constants=True)
        except Exception as error:  # noqa: BLE001  (the module itself then; capture may still hold)
            reason = refusal_reason("not specialized", error)
            self.refusals.append(reason)
            log.info("%s: %s; capturing the module as it runs", self.label, reason)
            return self.function
        count = len(tensors)

        def run(*inputs: torch.Tensor) -> Sequence[torch.Tensor]:
            results = spec.module(*inputs, *spec.constants)
            with torch.no_grad():
                for index, value in zip(spec.mutated, results[spec.num_outputs :]):
                    (inputs[index] if index < count else spec.constants[index - count]).copy_(value)
            return results[: spec.num_outputs]

        return run

    def _capture(self, key: Tuple, entry: _Signature, accumulate: bool) -> bool:
        recorder = self.streams.recorder()
        try:
            entry.results[accumulate] = recorder.capture(lambda: self._body(entry, accumulate))
        except Exception as error:  # noqa: BLE001  (what a stream cannot record: run eagerly)
            self._signatures[key] = None
            reason = refusal_reason("capture failed", error)
            self.refusals.append(reason)
            report_once(self.label, reason)
            return False
        entry.recorders[accumulate] = recorder
        return True
