"""If, Loop, Scan and SequenceMap: their bodies are converted like any graph (graph.builder) and run by a
Python loop or branch.  A body may read values of the enclosing graph by name: those become
extra inputs of the node here, fed from the outer scope."""

from __future__ import annotations

from typing import List, Sequence

import onnx
import torch

from ..converter_registry import register
from ..options import current, current_opsets
from ._common import OnnxGraph, OnnxModule, OnnxNode, result


def outer_names(graph: onnx.GraphProto) -> List[str]:
    """Values a (sub)graph reads from its enclosing scope, nested bodies included."""
    defined = {value.name for value in graph.input} | {init.name for init in graph.initializer}
    used: List[str] = []

    def read(name: str) -> None:
        if name and name not in defined and name not in used:
            used.append(name)

    for node in graph.node:
        for name in node.input:
            read(name)
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                for name in outer_names(attribute.g):
                    read(name)
        defined.update(node.output)
    return used


def _body(graph: onnx.GraphProto, outer: Sequence[str], label: str) -> torch.nn.Module:
    from ..module_builder import build_graph_module

    inputs = [value.name for value in graph.input] + list(outer)
    outputs = [value.name for value in graph.output]
    return build_graph_module(graph, current_opsets(), inputs, outputs, label, current().gradients)


def _graph_attribute(node: OnnxNode, name: str) -> onnx.GraphProto:
    return next(a.g for a in node.proto.attribute if a.name == name)


class If(OnnxModule):
    def __init__(self, then_body, then_outer, else_body, else_outer, outer, outputs: int):
        super().__init__()
        self.then_body, self.else_body = then_body, else_body
        self.then_outer, self.else_outer, self.outer, self.outputs = then_outer, else_outer, outer, outputs

    def forward(self, condition: torch.Tensor, *outer):
        values = dict(zip(self.outer, outer))
        body, names = (self.then_body, self.then_outer) if bool(condition) else (self.else_body, self.else_outer)
        out = body(*[values[name] for name in names])
        return out[0] if self.outputs == 1 else tuple(out)


@register("If", 1, 11, 13, 16, 19, 21)
def _if(node: OnnxNode, graph: OnnxGraph):
    then_graph, else_graph = _graph_attribute(node, "then_branch"), _graph_attribute(node, "else_branch")
    then_outer, else_outer = outer_names(then_graph), outer_names(else_graph)
    outer = list(dict.fromkeys(then_outer + else_outer))
    module = If(
        _body(then_graph, then_outer, f"{node.name} then_branch"),
        then_outer,
        _body(else_graph, else_outer, f"{node.name} else_branch"),
        else_outer,
        outer,
        len(node.output_values),
    )
    return result(module, node, [node.input_values[0]] + outer)


class Loop(OnnxModule):
    """`for i in range(M) while cond`: loop-carried values v, scan outputs stacked per step."""

    def __init__(self, body, has_trip_count: bool, has_condition: bool, carried: int, outer: int, outputs: int):
        super().__init__()
        self.body, self.has_trip_count, self.has_condition = body, has_trip_count, has_condition
        self.carried, self.outer, self.outputs = carried, outer, outputs

    def forward(self, *inputs):
        position = 0
        trip_count = None
        if self.has_trip_count:
            trip_count, position = int(inputs[0]), 1
        keep_going = True
        if self.has_condition:
            keep_going, position = bool(inputs[position]), position + 1
        values = list(inputs[position : position + self.carried])
        outer = list(inputs[position + self.carried :])
        scans: List[List[torch.Tensor]] = []
        step = 0
        while keep_going and (trip_count is None or step < trip_count):
            out = self.body(torch.tensor(step, dtype=torch.int64), torch.tensor(keep_going), *values, *outer)
            keep_going = bool(out[0])
            values = list(out[1 : 1 + self.carried])
            scans.append(list(out[1 + self.carried :]))
            step += 1
        stacked = [torch.stack([s[k] for s in scans]) for k in range(len(scans[0]))] if scans else []
        results = (values + stacked)[: self.outputs]
        return results[0] if self.outputs == 1 else tuple(results)


@register("Loop", 1, 11, 13, 16, 19, 21)
def _loop(node: OnnxNode, graph: OnnxGraph):
    body = _graph_attribute(node, "body")
    outer = outer_names(body)
    present = [position < len(node.input_values) and bool(node.input_values[position]) for position in (0, 1)]
    carried = list(node.input_values[2:])
    inputs = [node.input_values[p] for p in (0, 1) if present[p]] + carried + outer
    module = Loop(
        _body(body, outer, f"{node.name} body"),
        present[0],
        present[1],
        len(carried),
        len(outer),
        len(node.output_values),
    )
    return result(module, node, inputs)


class Scan(OnnxModule):
    """Scan-9+: states carried over the slices of the scan inputs along their axes (either
    direction); Scan-8 does the same per batch element (axis 0)."""

    def __init__(
        self,
        body,
        states: int,
        scan_inputs: int,
        input_axes,
        input_directions,
        output_axes,
        output_directions,
        outer: int,
        batched: bool,
        outputs: int,
    ):
        super().__init__()
        self.body, self.states, self.scan_inputs, self.outer = body, states, scan_inputs, outer
        self.input_axes, self.input_directions = input_axes, input_directions
        self.output_axes, self.output_directions = output_axes, output_directions
        self.batched, self.outputs = batched, outputs

    def _scan(self, states, scans, outer):
        axes = [(a if a >= 0 else a + x.dim()) for a, x in zip(self.input_axes, scans)]
        length = scans[0].shape[axes[0]]
        collected: List[List[torch.Tensor]] = []
        for t in range(length):
            slices = [x.select(a, length - 1 - t if d else t) for x, a, d in zip(scans, axes, self.input_directions)]
            out = self.body(*states, *slices, *outer)
            states = list(out[: self.states])
            collected.append(list(out[self.states :]))
        stacked = []
        for k in range(len(collected[0]) if collected else 0):
            items = [c[k] for c in collected]
            if self.output_directions[k]:
                items = items[::-1]
            axis = self.output_axes[k]
            stacked.append(torch.stack(items, dim=axis if axis >= 0 else axis + items[0].dim() + 1))
        return states + stacked

    def forward(self, *inputs):
        states = list(inputs[: self.states])
        scans = list(inputs[self.states : self.states + self.scan_inputs])
        outer = list(inputs[self.states + self.scan_inputs :])
        if not self.batched:
            results = self._scan(states, scans, outer)
        else:  # Scan-8: (sequence_lens,) states [B, ...], scans [B, T, ...]
            per_batch = [
                self._scan([s[b] for s in states], [x[b] for x in scans], outer) for b in range(scans[0].shape[0])
            ]
            results = [torch.stack([r[k] for r in per_batch]) for k in range(len(per_batch[0]))]
        results = results[: self.outputs]
        return results[0] if self.outputs == 1 else tuple(results)


def _scan(batched: bool):
    def convert(node: OnnxNode, graph: OnnxGraph):
        a = node.attributes
        body = _graph_attribute(node, "body")
        outer = outer_names(body)
        count = int(a["num_scan_inputs"])
        values = list(node.input_values)
        if batched:
            if values[0]:
                raise NotImplementedError("Scan-8 with sequence_lens")
            values = values[1:]
        states = len(values) - count
        scan_outputs = len(body.output) - states
        module = Scan(
            _body(body, outer, f"{node.name} body"),
            states,
            count,
            list(a.get("scan_input_axes", [0] * count)) if not batched else [0] * count,
            list(a.get("scan_input_directions", a.get("directions", [0] * count))),
            list(a.get("scan_output_axes", [0] * scan_outputs)) if not batched else [0] * scan_outputs,
            list(a.get("scan_output_directions", [0] * scan_outputs)) if not batched else [0] * scan_outputs,
            len(outer),
            batched,
            len(node.output_values),
        )
        return result(module, node, values + outer)

    return convert


register("Scan", 8)(_scan(batched=True))
register("Scan", 9, 11, 16, 19, 21)(_scan(batched=False))


class SequenceMap(OnnxModule):
    """The body applied to the i-th element of every sequence input (tensor inputs as they
    are); each body output collected into a sequence."""

    def __init__(self, body, inputs: int, outputs: int):
        super().__init__()
        self.body, self.inputs, self.outputs = body, inputs, outputs

    def forward(self, *values):
        mapped, outer = values[: self.inputs], values[self.inputs :]
        count = len(mapped[0])
        collected: List[List[torch.Tensor]] = [[] for _ in range(self.outputs)]
        for i in range(count):
            args = [v[i] if isinstance(v, list) else v for v in mapped]
            for k, out in enumerate(self.body(*args, *outer)):
                collected[k].append(out)
        return collected[0] if self.outputs == 1 else tuple(collected)


@register("SequenceMap", 17)
def _sequence_map(node: OnnxNode, graph: OnnxGraph):
    body = _graph_attribute(node, "body")
    outer = outer_names(body)
    module = SequenceMap(_body(body, outer, f"{node.name} body"), len(node.input_values), len(node.output_values))
    return result(module, node, list(node.input_values) + outer)
