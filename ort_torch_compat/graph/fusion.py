"""Graph rewrites that keep the numbers and remove passes over activations.

Exporters write a dense layer on 3-D activations as `MatMul(x, W)` (often with
`W = Transpose(weight)`) then `Add(., b)`: two or three kernels and extra passes over the
whole output.  `MatMul(x, W) + b` with a 2-D `W` and a 1-D `b` becomes one `addmm`, and
`MatMul(x, Transpose(weight)) + b` one `linear` (see converters/fused.py), which is how
PyTorch runs its own Linear layers; so does `MatMul(x, Transpose(weight))` without a bias
(one node fewer per layer: at on-device sizes the per-node cost is the step).  Only exact
rewrites live here: the fused kernel computes the same sum, in the same order up to float
rounding.
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


def _is_matrix_transpose(node: onnx.NodeProto, shapes) -> bool:
    """A Transpose that swaps the two axes of a known 2-D tensor."""
    if node.op_type != "Transpose" or node.domain not in ("", "ai.onnx"):
        return False
    shape = shapes.get(node.input[0])
    perm = [list(a.ints) for a in node.attribute if a.name == "perm"]
    return shape is not None and len(shape) == 2 and (not perm or perm[0] == [1, 0])


def fuse_matmul_bias(graph: onnx.GraphProto) -> List[onnx.NodeProto]:
    """The graph's nodes with MatMul+Add(bias) pairs replaced by one MatMulBias node."""
    nodes = list(graph.node)  # indices, not id(): protobuf may hand out fresh wrappers
    if not any(node.op_type == "MatMul" for node in nodes):
        return nodes  # nothing to fuse: skip the per-node bookkeeping (large graphs)
    shapes = _static_shapes(graph)
    consumers = Counter(name for node in nodes for name in node.input)
    outputs = {out.name for out in graph.output}
    by_output = {node.output[0]: index for index, node in enumerate(nodes) if node.output}
    replaced: Dict[int, onnx.NodeProto] = {}
    dropped = set()
    for index, node in enumerate(nodes):
        if node.op_type != "Add" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
            continue
        for position in (0, 1):
            producer_index = by_output.get(node.input[position])
            producer = None if producer_index is None else nodes[producer_index]
            bias = node.input[1 - position]
            if producer is None or producer.op_type != "MatMul" or producer.domain not in ("", "ai.onnx"):
                continue
            product = producer.output[0]
            if consumers[product] != 1 or product in outputs:
                continue
            op, weight = "MatMulBias", producer.input[1]
            transpose_index = by_output.get(weight)
            transpose = None if transpose_index is None else nodes[transpose_index]
            if (
                transpose is not None
                and _is_matrix_transpose(transpose, shapes)
                and consumers[weight] == 1
                and weight not in outputs
            ):
                op, weight = "LinearBias", transpose.input[0]
            weight_shape, bias_shape = shapes.get(weight), shapes.get(bias)
            if weight_shape is None or bias_shape is None or len(weight_shape) != 2 or len(bias_shape) != 1:
                continue
            out_features = weight_shape[0] if op == "LinearBias" else weight_shape[1]
            if out_features is None or bias_shape[0] != out_features:
                continue
            fused = onnx.helper.make_node(
                op,
                [producer.input[0], weight, bias],
                [node.output[0]],
                name=f"{producer.name}+{node.name}",
                domain=FUSED_DOMAIN,
            )
            replaced[producer_index] = fused
            dropped.add(index)
            if op == "LinearBias":
                dropped.add(transpose_index)
            break
    # MatMul(x, Transpose(weight)) without a bias (Llama's, T5's projections): one `linear`,
    # which computes matmul(x, weight.t()) itself; the Transpose node goes.
    for index, node in enumerate(nodes):
        if index in replaced or node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
            continue
        weight = node.input[1]
        transpose_index = by_output.get(weight)
        if transpose_index is None or transpose_index in dropped:
            continue
        transpose = nodes[transpose_index]
        if _is_matrix_transpose(transpose, shapes) and consumers[weight] == 1 and weight not in outputs:
            replaced[index] = onnx.helper.make_node(
                "Linear", [node.input[0], transpose.input[0]], [node.output[0]], name=node.name, domain=FUSED_DOMAIN
            )
            dropped.add(transpose_index)
    return [replaced.get(i, node) for i, node in enumerate(nodes) if i not in dropped]
