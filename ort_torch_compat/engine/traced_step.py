"""Train steps as one traced aten graph run by TorchScript's interpreter: no C++ compiler.

Why (measured, docs/design.md "The traced step"): at on-device sizes a train step is
400-600 aten calls on tensors of a few hundred elements, and what costs is the framework
around each call, not the kernel: the converted module's Python (one module per ONNX node)
and autograd's graph (one node per op, recorded and walked every step).  The same calls
made by TorchScript's C++ interpreter, from one graph holding the forward and its backward,
cost 2.5-4x less on the tiny real architectures; no compiler runs, nothing is cached on
disk, and the kernels are the eager step's own (torch's fused layer norm, softmax and
their backward; no decompositions; oneDNN's dense-layer products where the eager step uses
them, graph/dense_kernel.py), so the numbers are the eager step's.

How: `graph/specialize.py` traces the converted module for this input signature
(random operators kept: they draw from torch's generator as the module does; constant
subgraphs folded), `joint_graph.joint_train_graph` traces its forward and autograd backward
into one graph returning the outputs and the flat gradients, `_script` hands that graph to
`torch.jit.script`.  The step is checked once against the eager step on the first batch
(`step_check`: a disagreement refuses it) and timed against it: the runner
(compiled.py) uses it only where it is faster.  TorchScript is deprecated (torch 2.14
warns); where it is missing or refuses a graph, the steps run eagerly as before.

Kernels: ATen sends some float32 CPU operators to oneDNN (GELU and its backward,
convolutions), which costs 7-11 us a call before any work (GELU on a 2x8x64 tensor: 9.3 us
against ATen's own 2.4 us; its backward 14.7 against 3.1) and pays only on large tensors
(depthwise convolutions, though, are 4x slower without it: MobileNet-v2's step).  A graph
with such operators has those calls timed both ways at build (onednn_choice.py: the calls
alone, on tensors of their shapes; timing the whole step both ways chose oneDNN's GELU in
1 BERT-tiny build of 6, 15% of its step) and runs ATen's kernels (`torch.backends.mkldnn`
switched off around the step, on again after) where they take at most 90% of oneDNN's
time; ATen's kernels agree with oneDNN's within float32 rounding (GELU: 7e-7).  Graphs
without them are not timed.  `drop_redundant_views` removes the view calls that change nothing first.

Static Runtime (TorchScript's other executor, `torch._C._jit_to_static_module`): out-variant
kernels writing into memory planned from the first runs, no interpreter frame per call.
On the tiny transformers and the LSTM its step takes 0.69-0.84 of the interpreter's
(docs/design.md); on the convolutional and hand-made models it is slower.  So a traced step
of at most `_STATIC_MAX_MS` is also built on it, checked against the eager step on three
runs (past its recording and planning runs), timed against the interpreter (`time_runs`)
and used where it takes at most 90% of the time (timed again, up to twice, where it is faster
but not by that much: on the AVX2-only AMD host LoRA-tiny's Static Runtime took 0.73-0.80x
the interpreter's in seven builds of eight and 0.885x in one, and a process of the benchmark
ran the interpreter's 1.6x slower step for its whole run).  It fails on its second run where a
backward call leaves an output undefined (a frozen LayerNorm's weight gradient), so its
graph asks for every backward output (`fill_output_masks`; the extra ones are dropped).
A step on it that fails later where the eager step does not hands over to its interpreter
form (`interpreted`; compiled.py's `disagreed`).
"""

from __future__ import annotations

import logging
import operator
import warnings
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import fx

from .compiled_step import FlatGradientStep, gradient_groups
from .fixed_views import ALIASING_VIEWS, FixedViews, hoist_fixed_views
from .joint_graph import joint_train_graph
from .onednn_choice import atens_share, onednn_calls
from .step_check import check_against_eager, time_runs, time_steps

_TIMED_ROUNDS = 3  # eager and traced steps timed, interleaved, before the traced step is used
_NATIVE_MARGIN = 0.9  # ATen's own kernels replace oneDNN's where their calls take at most this share of the time
_STATIC_MARGIN = 0.9  # Static Runtime replaces the interpreter where it takes at most this share of the time
_STATIC_MAX_MS = 20.0  # traced steps longer than this are kernel-bound: Static Runtime is not tried
_STATIC_TIMED_ROUNDS = 10  # rounds of the two forms' runs (~20 ms on the tiny transformers)
_STATIC_RETIMINGS = 2  # times the rounds are run again where Static Runtime is faster, but not by the margin
_STATIC_CHECKED_RUNS = 3  # its first run records, the second plans its memory: checked past both


def torchscript_available() -> bool:
    """Whether this torch still has TorchScript's compiler and interpreter."""
    return callable(getattr(torch.jit, "script", None))


class TracedTrainStep(FlatGradientStep):
    """The train step (forward, backward and flat gradients) of one graph for one input
    signature, as a TorchScript function."""

    def __init__(
        self,
        function: torch.jit.ScriptModule,
        constants: List[torch.Tensor],
        num_outputs: int,
        mutated: List[int],
        grad_groups: List[List[int]],
        onednn: bool = True,
        interpreted: Optional["TracedTrainStep"] = None,
        fixed_views: Optional[FixedViews] = None,
    ):
        self.function = function  # a ScriptModule, or its Static Runtime (`static`)
        self.interpreted = interpreted  # on Static Runtime: the interpreter's form of the step
        self.constants = constants
        self.num_outputs = num_outputs
        self.mutated = mutated
        self.grad_groups = grad_groups
        self.onednn = onednn  # False: oneDNN switched off around the step (ATen's own kernels)
        self.fixed_views = fixed_views  # views of the parameters taken out of the graph (its last inputs)
        self.error: Optional[BaseException] = None  # why the last run failed

    @property
    def static(self) -> bool:
        """Whether Static Runtime runs the step (else TorchScript's interpreter)."""
        return self.interpreted is not None

    def without_onednn(self) -> "TracedTrainStep":
        """The same step, run with ATen's own kernels where it would call oneDNN's."""
        return TracedTrainStep(
            self.function,
            self.constants,
            self.num_outputs,
            self.mutated,
            self.grad_groups,
            False,
            self.interpreted,
            self.fixed_views,
        )

    def on_static_runtime(self, function: Optional[torch.jit.ScriptModule] = None) -> "TracedTrainStep":
        """The same step run by TorchScript's Static Runtime (see the module docstring): this
        step's graph, or `function` (its graph with every backward output computed).  Raises
        what Static Runtime raises where it refuses the graph."""
        runtime = torch._C._jit_to_static_module((function or self.function)._c)
        return TracedTrainStep(
            runtime,
            self.constants,
            self.num_outputs,
            self.mutated,
            self.grad_groups,
            self.onednn,
            interpreted=self,
            fixed_views=self.fixed_views,
        )

    def _arguments(self, tensors: Sequence[torch.Tensor], contiguous_tail: int) -> List[torch.Tensor]:
        arguments = super()._arguments(tensors, contiguous_tail)
        if self.fixed_views:
            arguments += self.fixed_views.of(arguments)
        return arguments

    def run(
        self, tensors: Sequence[torch.Tensor], contiguous_tail: int = 0
    ) -> Optional[Tuple[List[torch.Tensor], List[torch.Tensor]]]:
        """(outputs, flat gradients) of the step on `tensors`; running statistics written
        back after the step.  None, having written nothing back, where the graph raised (an
        index out of range, say): the caller runs the eager step, which raises the error
        with its explanation."""
        arguments = self._arguments(tensors, contiguous_tail)
        onednn = self.onednn or not torch._C._get_mkldnn_enabled()
        if not onednn:
            torch._C._set_mkldnn_enabled(False)
        # parameters require grad: no autodiff graph in the interpreter.  The switch itself,
        # not `torch.no_grad()`, whose context manager costs ~2 us a step (LSTM-tiny: 3-4 us)
        grad_was_enabled = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)
        try:
            results = self.function(*arguments)
        except Exception as error:  # noqa: BLE001  (the eager step raises it, explained)
            self.error = error
            return None
        finally:
            torch._C._set_grad_enabled(grad_was_enabled)
            if not onednn:
                torch._C._set_mkldnn_enabled(True)
        return self._split(arguments, results)


log = logging.getLogger("ort_torch_compat.compile")

_aten = torch.ops.aten
_RESHAPES = {_aten.view.default, _aten._unsafe_view.default, _aten.reshape.default}


def _dense(node: object) -> bool:
    value = getattr(node, "meta", {}).get("val")
    return isinstance(value, torch.Tensor) and value.is_contiguous()


def _same_shape(node: fx.Node, source: object) -> bool:
    value, source_value = node.meta.get("val"), getattr(source, "meta", {}).get("val")
    return (
        isinstance(value, torch.Tensor) and isinstance(source_value, torch.Tensor) and value.shape == source_value.shape
    )


def _view_key(node: fx.Node) -> Optional[Tuple]:
    """What the view call `node` computes (its operator and arguments, lists as tuples), or
    None where `node` is not a view call: two calls with the same key give the same alias
    of the same tensor."""
    if node.op != "call_function" or node.target not in ALIASING_VIEWS:
        return None

    def frozen(value: object) -> object:
        return tuple(frozen(v) for v in value) if isinstance(value, (list, tuple)) else value

    return (node.target, frozen(node.args), frozen(sorted(node.kwargs.items())))


def drop_redundant_views(graph: fx.GraphModule) -> int:
    """Remove the view calls of `graph` that change nothing or repeat another, and shorten
    reshape chains: a reshape of a reshape of a dense tensor (then dropped where it gives the
    shape the tensor has), a reshape of a dense tensor to its own shape, an expand to the
    shape a tensor has, a transpose of a transpose, a detach or alias (the step runs under
    no_grad), and a view call made again with the same arguments (LoRA-tiny's graph takes
    the embedding's 2-D view once per projection).  `make_fx` records each as an aten call
    (~0.3-1 us each in the interpreter and Static Runtime; LoRA-tiny: 80 of 382 calls).  Every
    replacement is an alias of what it replaces, with the same shape and strides, so the
    values, and what aliases what, are unchanged.  Returns how many calls were removed."""
    before = len(graph.graph.nodes)
    made: Dict[Tuple, fx.Node] = {}  # each view call's key -> the first call making it
    for node in list(graph.graph.nodes):
        if node.op != "call_function" or not node.args:
            continue
        source = node.args[0]
        if node.target in _RESHAPES and getattr(source, "target", None) in _RESHAPES and _dense(source.args[0]):
            node.args = (source.args[0], *node.args[1:])
            if not source.users:  # nothing else reads the intermediate shape
                made.pop(_view_key(source), None)
                graph.graph.erase_node(source)
            source = node.args[0]
        if (node.target in _RESHAPES and _same_shape(node, source) and _dense(source)) or (
            node.target is _aten.expand.default and _same_shape(node, source)  # expand keeps strides
        ):
            replacement = source
        elif node.target in (_aten.detach.default, _aten.alias.default):
            replacement = source
        elif node.target is _aten.t.default and getattr(source, "target", None) is _aten.t.default:
            replacement = source.args[0]
        else:
            key = _view_key(node)
            if key is None:
                continue
            replacement = made.setdefault(key, node)
            if replacement is node:
                continue
        node.replace_all_uses_with(replacement)
        graph.graph.erase_node(node)
        if node.target is _aten.t.default and source is not replacement and not source.users:
            made.pop(_view_key(source), None)
            graph.graph.erase_node(source)
    graph.recompile()  # no dead-code pass: it would drop a random operator whose result is unused
    return before - len(graph.graph.nodes)


def drop_unread_calls(graph: fx.GraphModule) -> int:
    """Remove the calls of `graph` whose results nothing reads, where the call only computes
    (an aten operator that neither mutates nor draws random numbers: a dropped random call
    would shift every later draw): a backward's gradients of constants, such as an LSTM's
    product for its initial state's gradient.  Returns how many calls were removed."""
    removed = 0
    for node in reversed(list(graph.graph.nodes)):  # a removed call's inputs come after it here
        if node.op == "call_function" and not node.users and _computes_only(node.target):
            graph.graph.erase_node(node)
            removed += 1
    graph.recompile()
    return removed


def _computes_only(target: object) -> bool:
    if target is operator.getitem:
        return True
    schema = getattr(target, "_schema", None)
    return (
        schema is not None
        and not schema.is_mutable
        and torch.Tag.nondeterministic_seeded not in getattr(target, "tags", ())
    )


def _script(graph: fx.GraphModule) -> torch.jit.ScriptModule:
    """`graph` (aten operator overloads) as TorchScript, which resolves overload packets by
    their schema, takes devices as strings and has no `_to_copy(x, dtype=...)` form."""
    for node in graph.graph.nodes:
        if node.op != "call_function":
            continue
        if isinstance(node.target, torch._ops.OpOverload):
            node.target = node.target.overloadpacket
        if node.target is torch.ops.aten._to_copy and len(node.args) == 1 and set(node.kwargs) == {"dtype"}:
            node.target = torch.ops.aten.to
        node.kwargs = {k: (v.type if isinstance(v, torch.device) else v) for k, v in node.kwargs.items()}
    graph.recompile()
    with warnings.catch_warnings():  # "torch.jit.script is deprecated", remarks on fx's module: ours, not the user's
        warnings.simplefilter("ignore")
        return torch.jit.script(graph)


def build_traced_step(
    module: fx.GraphModule, tensors: Sequence[torch.Tensor], fixed: int = 0
) -> Tuple[TracedTrainStep, float, float]:
    """The traced step of `module` for inputs shaped like `tensors` (feeds, then parameters),
    checked against the eager step, with or without oneDNN's kernels and on the interpreter
    or Static Runtime, whichever is faster; with the eager and traced step's CPU
    milliseconds.  The last `fixed` tensors are the same tensor objects in every step (the
    engine's parameters): view calls on them are made once, not every step (fixed_views.py).
    Raises NotSpecializable (or what TorchScript raises) where the graph cannot be traced."""
    from ..graph.specialize import specialize

    spec = specialize(module, tensors, allow_random=True, fold_constants=True, hand_derived_backwards=True)
    graph = joint_train_graph(spec, tensors, {})
    drop_redundant_views(graph)
    means_as_sums(graph)
    gathers_as_embeddings(graph)
    drop_unread_calls(graph)
    fixed_views = FixedViews(hoist_fixed_views(graph, len(tensors) - fixed))
    onednn_on = torch.backends.mkldnn.is_available() and torch._C._get_mkldnn_enabled()
    calls = onednn_calls(graph) if onednn_on else None  # before scripting renames the targets
    step = TracedTrainStep(
        _script(graph),
        list(spec.constants),
        spec.num_outputs,
        spec.mutated,
        gradient_groups(tensors),
        fixed_views=fixed_views if len(fixed_views) else None,
    )
    check_against_eager(step, module, tensors)
    if calls and atens_share(calls) <= _NATIVE_MARGIN:  # a clear gain (tiny GELUs: 4-6x), not noise
        native = step.without_onednn()
        if _agrees(native, module, tensors):  # expected (the kernels agree within rounding)
            step = native
    eager_ms, traced_ms = time_steps(module, tensors, [step], _TIMED_ROUNDS)
    if traced_ms <= _STATIC_MAX_MS:
        step, traced_ms = _faster_on_static_runtime(step, traced_ms, graph, module, tensors)
    return step, eager_ms, traced_ms


def fill_output_masks(graph: fx.GraphModule) -> int:
    """Ask every backward call of `graph` for all its outputs (`output_mask` all True):
    Static Runtime fails on its second run of a graph where one is left undefined (a frozen
    LayerNorm's weight gradient, the first convolution's input gradient; torch 2.6-2.14).
    The extra outputs are computed and dropped; the others are unchanged.  Returns how many
    calls changed."""
    changed = 0
    for node in graph.graph.nodes:
        if node.op != "call_function" or not getattr(node.target, "__name__", "").split(".")[0].endswith("_backward"):
            continue
        args = list(node.args)
        for index, value in enumerate(args):
            if (
                isinstance(value, (list, tuple))
                and value
                and all(isinstance(v, bool) for v in value)
                and not all(value)
            ):
                args[index] = [True] * len(value)
                changed += 1
        node.args = tuple(args)
    if changed:
        graph.recompile()
    return changed


def _value(node: object) -> Optional[torch.Tensor]:
    """The tensor a graph node records (fx's "val"), or None."""
    value = getattr(node, "meta", {}).get("val")
    return value if isinstance(value, torch.Tensor) else None


def means_as_sums(graph: fx.GraphModule) -> int:
    """Write each mean over dimensions of a float32 or float64 CPU tensor in `graph` as the
    sum over them divided by their size: what ATen's CPU `mean` does inside (`sum_out`, then
    `div_` by the count), so the values are bitwise the same, at 2 calls of ~3 us against
    one of 14 us (Static Runtime, LoRA-tiny's pooling, one thread).  Returns how many calls
    changed."""
    changed = 0
    for node in graph.graph.nodes:
        if node.op != "call_function" or node.target is not _aten.mean.dim or "dtype" in node.kwargs:
            continue
        dims = node.args[1] if len(node.args) > 1 else None
        value = _value(node.args[0])
        if (
            value is None
            or value.dtype not in (torch.float32, torch.float64)
            or value.device.type != "cpu"
            or not dims
            or len(node.args) > 3
        ):
            continue
        count = 1
        for dim in dims:
            count *= value.shape[dim]
        with graph.graph.inserting_before(node):
            total = graph.graph.call_function(_aten.sum.dim_IntList, tuple(node.args), dict(node.kwargs))
            total.meta = dict(node.meta)
            mean = graph.graph.call_function(_aten.div.Scalar, (total, count))
            mean.meta = dict(node.meta)
        node.replace_all_uses_with(mean)
        graph.graph.erase_node(node)
        changed += 1
    if changed:
        graph.recompile()
    return changed


def _table_and_rows(node: fx.Node) -> Optional[Tuple[fx.Node, fx.Node]]:
    """(table, indices) where `node` gathers rows of a 2-D floating-point CPU table by one
    integer index tensor (`index(table, [indices])`, ONNX's Gather on axis 0), else None."""
    if len(node.args) != 2 or not isinstance(node.args[1], (list, tuple)) or len(node.args[1]) != 1:
        return None
    table, rows = node.args[0], node.args[1][0]
    table_value, rows_value = _value(table), _value(rows)
    if (
        table_value is None
        or rows_value is None
        or table_value.dim() != 2
        or not table_value.is_floating_point()
        or table_value.device.type != "cpu"
        or rows_value.dtype not in (torch.int64, torch.int32)
    ):
        return None
    return table, rows


def gathers_as_embeddings(graph: fx.GraphModule) -> int:
    """Write row gathers of `graph` as embedding lookups: `index(table, [rows])` on a 2-D
    floating-point CPU table as `embedding(table, rows)`, and such a gather's gradient,
    `index_put(zeros, [rows], grad, accumulate=True)` into a fresh zero tensor of the
    table's shape, as `embedding_dense_backward(grad, rows, table rows, -1, False)`.  The
    same rows copied and the same sums in the same order (bitwise the same, with repeated
    rows too: tests/test_traced_step.py), at fewer microseconds: on one thread, a 16-row
    lookup 5.6-8 us against 7.2-13, the gradient into a 128x32 table 7.2 against 11.7 us,
    into 30522x128 0.69 against 1.9 ms.  ONNX's Gather allows negative indices, which
    `embedding` refuses: a step with one raises, and the engine runs the eager step, which
    takes them, and retires the traced one.  Returns how many calls changed."""
    changed = 0
    for node in list(graph.graph.nodes):
        if node.op != "call_function":
            continue
        gather = _table_and_rows(node) if node.target is _aten.index.Tensor else None
        if gather:
            table, rows = gather
            with graph.graph.inserting_before(node):
                lookup = graph.graph.call_function(_aten.embedding.default, (table, rows))
            lookup.meta = dict(node.meta)
            node.replace_all_uses_with(lookup)
            graph.graph.erase_node(node)
            changed += 1
        elif node.target is _aten.index_put.default and len(node.args) == 4 and node.args[3] is True:
            zeros, indices, grad = node.args[:3]
            zeros_value, grad_value = _value(zeros), _value(grad)
            if (
                getattr(zeros, "target", None) not in (_aten.new_zeros.default, _aten.zeros.default)
                or len(zeros.users) != 1
                or zeros_value is None
                or grad_value is None
                or not isinstance(indices, (list, tuple))
                or len(indices) != 1
            ):
                continue
            rows_value = _value(indices[0])
            if (
                rows_value is None
                or rows_value.dtype not in (torch.int64, torch.int32)
                or zeros_value.dim() != 2
                or not zeros_value.is_floating_point()
                or zeros_value.device.type != "cpu"
                or grad_value.dtype != zeros_value.dtype
                or tuple(grad_value.shape) != (*rows_value.shape, zeros_value.shape[1])
            ):
                continue
            with graph.graph.inserting_before(node):
                gradient = graph.graph.call_function(
                    _aten.embedding_dense_backward.default, (grad, indices[0], zeros_value.shape[0], -1, False)
                )
            gradient.meta = dict(node.meta)
            node.replace_all_uses_with(gradient)
            graph.graph.erase_node(node)
            graph.graph.erase_node(zeros)
            changed += 1
    if changed:
        graph.recompile()
    return changed


def sums_on_out_variants(graph: fx.GraphModule) -> int:
    """Write each sum of two floating-point tensors (`add`, alpha 1) of `graph` as `sub`
    with alpha -1, for Static Runtime: it runs `sub` into its planned memory but allocates
    every `add` result (torch 2.14: 0.60 against 0.82 us a call on a 4x8 tensor).  ATen's
    `sub` is `add` with alpha negated, the same kernel: the values are bitwise the same.
    Returns how many calls changed."""
    changed = 0
    for node in graph.graph.nodes:
        if node.op != "call_function" or node.target not in (_aten.add, _aten.add.Tensor) or node.kwargs:
            continue
        value = node.meta.get("val")
        if (
            len(node.args) == 2
            and all(
                isinstance(arg, fx.Node)
                and isinstance(arg.meta.get("val"), torch.Tensor)
                and arg.meta["val"].is_floating_point()  # ATen's sub refuses bool tensors
                for arg in node.args
            )
            and isinstance(value, torch.Tensor)
            and value.is_floating_point()
        ):
            node.target = _aten.sub if node.target is _aten.add else _aten.sub.Tensor
            node.kwargs = {"alpha": -1}
            changed += 1
    if changed:
        graph.recompile()
    return changed


def _agrees(step: TracedTrainStep, module: fx.GraphModule, tensors: Sequence[torch.Tensor]) -> bool:
    from ..graph.specialize import NotSpecializable

    try:
        check_against_eager(step, module, tensors)
    except NotSpecializable:
        return False
    return True


def _faster_on_static_runtime(
    step: TracedTrainStep,
    traced_ms: float,
    graph: fx.GraphModule,
    module: fx.GraphModule,
    tensors: Sequence[torch.Tensor],
) -> Tuple[TracedTrainStep, float]:
    """`step` (of `graph`) on Static Runtime where that is available, agrees with the eager
    step past its memory planning and takes at most `_STATIC_MARGIN` of `step`'s time; else
    `step`."""
    try:
        # a new module for the changed graph: TorchScript keeps what it compiled per class
        changed = fill_output_masks(graph) + sums_on_out_variants(graph)
        full = _script(fx.GraphModule(graph, graph.graph)) if changed else None
        static = step.on_static_runtime(full)
    except Exception as error:  # noqa: BLE001  (a graph it refuses, or a torch without it)
        log.info("Static Runtime refuses the traced step (%s: %s)", type(error).__name__, str(error)[:200])
        return step, traced_ms
    try:
        check_against_eager(static, module, tensors, _STATIC_CHECKED_RUNS)
    except Exception as error:  # noqa: BLE001  (disagrees, or raised: LoRA-tiny's second run does)
        log.info("Static Runtime's step is not used: %s", str(error)[:200])
        return step, traced_ms
    interpreted_ms, static_ms = time_runs(module, tensors, [step, static], _STATIC_TIMED_ROUNDS)
    for _ in range(_STATIC_RETIMINGS):  # close: a burst of the host's load may have hit one form's runs
        if static_ms <= _STATIC_MARGIN * interpreted_ms or static_ms >= interpreted_ms:
            break
        again = time_runs(module, tensors, [step, static], _STATIC_TIMED_ROUNDS)
        interpreted_ms, static_ms = min(interpreted_ms, again[0]), min(static_ms, again[1])
    if static.error is None and static_ms <= _STATIC_MARGIN * interpreted_ms:
        return static, traced_ms * static_ms / interpreted_ms
    return step, traced_ms
