"""Graph rewrites that keep the numbers and remove passes over activations.

Exporters write a dense layer on 3-D activations as `MatMul(x, W)` then `Add(., b)`: two
kernels and an extra read/write of the whole output.  `MatMul(x, W) + b` with a 2-D `W`
and a 1-D `b` becomes one `addmm` (see converters/fused.py), which is also how PyTorch
runs its own Linear layers.  Only exact rewrites live here: the fused kernel computes the
same sum, in the same order up to float rounding.
"""
from __future__ import annotations

from collections import Counter
from typing import Dict, List, Optional, Tuple

import onnx

FUSED_DOMAIN = "ort_torch_compat"


def _static_shapes(graph: onnx.GraphProto) -> Dict[str, Tuple[Optional[int], ...]]:
    shapes: Dict[str, Tuple[Optional[int], ...]] = {}
    for info in list(graph.input) + list(graph.value_info):
        tensor_type = info.type.tensor_type
        if tensor_type.HasField("shape"):
            shapes[info.name] = tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim)
    for init in graph.initializer:
        shapes[init.name] = tuple(init.dims)
    return shapes


def fuse_matmul_bias(graph: onnx.GraphProto) -> List[onnx.NodeProto]:
    """The graph's nodes with MatMul+Add(bias) pairs replaced by one MatMulBias node."""
    shapes = _static_shapes(graph)
    consumers = Counter(name for node in graph.node for name in node.input)
    outputs = {out.name for out in graph.output}
    by_output = {node.output[0]: node for node in graph.node if node.output}
    replaced: Dict[int, onnx.NodeProto] = {}
    dropped = set()
    for node in graph.node:
        if node.op_type != "Add" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
            continue
        for position in (0, 1):
            producer = by_output.get(node.input[position])
            bias = node.input[1 - position]
            if producer is None or producer.op_type != "MatMul" or producer.domain not in ("", "ai.onnx"):
                continue
            product = producer.output[0]
            weight_shape = shapes.get(producer.input[1])
            bias_shape = shapes.get(bias)
            if consumers[product] != 1 or product in outputs or weight_shape is None or bias_shape is None:
                continue
            if len(weight_shape) != 2 or len(bias_shape) != 1 or None in weight_shape or bias_shape[0] != weight_shape[1]:
                continue
            fused = onnx.helper.make_node("MatMulBias", [producer.input[0], producer.input[1], bias], [node.output[0]],
                                          name=f"{producer.name}+{node.name}", domain=FUSED_DOMAIN)
            replaced[id(producer)] = fused
            dropped.add(id(node))
            break
    return [replaced.get(id(node), node) for node in graph.node if id(node) not in dropped]
