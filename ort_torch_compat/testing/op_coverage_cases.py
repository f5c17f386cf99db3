"""The one-op test cases of the op coverage suite (used by scripts/make_op_coverage.py).

Which ops and schema versions are covered is *not* decided here: the script enumerates every
ai.onnx schema (onnx.defs) and asks ONNX Runtime whether it runs it.  This module only says,
per op, what a meaningful small instance looks like: input shapes and value ranges that keep
away from kinks and poles (so gradients are well defined), and the attribute variants whose
semantics differ (pads, count_include_pad, ceil_mode, auto_pad, dilations, legacy broadcast
flags, axes as input or attribute, ...).  An op without an entry gets one float input of shape
(2, 3, 4); if ORT rejects that, the coverage table says so.

`cases(op, version)` returns the cases for one ai.onnx schema version; `CONTRIB_CASES` lists
the ORT-schema ops (com.microsoft, and ORT's own ai.onnx schemas below opset 17) that ORT's
graph transformers and generate_artifacts put into training and eval graphs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
from onnx import TensorProto

# ---- value specs --------------------------------------------------------------------------


@dataclass
class In:
    """One node input.  role: 'data' (a graph input; float data is trained), 'const' (an
    initializer), 'absent' (an omitted optional input)."""

    shape: Tuple[int, ...] = ()
    kind: str = "normal"  # normal | uniform | away | int | bool | values | string
    lo: float = -1.0
    hi: float = 1.0
    dtype: str = "float32"
    role: str = "data"
    values: object = None

    def make(self, rng: np.random.Generator) -> Optional[np.ndarray]:
        if self.role == "absent":
            return None
        if self.kind == "values":
            return np.array(self.values, dtype=self.dtype)
        if self.kind == "normal":
            value = rng.standard_normal(self.shape)
        elif self.kind == "uniform":
            value = rng.uniform(self.lo, self.hi, self.shape)
        elif self.kind == "away":  # |x| in [lo, hi], random sign: away from kinks at 0
            value = rng.uniform(self.lo, self.hi, self.shape) * rng.choice([-1.0, 1.0], self.shape)
        elif self.kind == "int":
            value = rng.integers(int(self.lo), int(self.hi), self.shape)
        elif self.kind == "bool":
            value = rng.integers(0, 2, self.shape).astype(bool)
        else:
            raise ValueError(self.kind)
        return np.asarray(value).astype(self.dtype)


def F(*shape, kind="normal", lo=-1.0, hi=1.0, role="data") -> In:
    return In(tuple(shape), kind, lo, hi, "float32", role)


def A(*shape, lo=0.2, hi=1.0, role="data") -> In:
    """Floats away from 0 (sign random, |x| in [lo, hi])."""
    return In(tuple(shape), "away", lo, hi, "float32", role)


def P(*shape, lo=0.5, hi=2.0, role="data") -> In:
    """Positive floats."""
    return In(tuple(shape), "uniform", lo, hi, "float32", role)


def U(*shape, lo=-1.0, hi=1.0, role="data") -> In:
    return In(tuple(shape), "uniform", lo, hi, "float32", role)


def I(values, dtype="int64", role="const") -> In:  # noqa: E743 (one-letter constructors, like F, A, P, U above)
    return In(np.shape(values), "values", dtype=dtype, role=role, values=values)


def IR(*shape, lo=0, hi=3, dtype="int64", role="data") -> In:
    """Random integers in [lo, hi)."""
    return In(tuple(shape), "int", lo, hi, dtype, role)


def B(*shape, role="data") -> In:
    return In(tuple(shape), "bool", dtype="bool", role=role)


def S(values, role="data") -> In:
    return In(np.shape(values), "values", dtype=np.str_, role=role, values=values)


def Fv(values, role="const") -> In:
    return In(np.shape(values), "values", dtype="float32", role=role, values=values)


NONE = In(role="absent")


# ---- cases ----------------------------------------------------------------------------------


@dataclass
class Case:
    """One small model: a node `op` (or a short chain when the op needs non-tensor values)."""

    op: str
    inputs: List[In]
    attrs: Dict[str, object] = field(default_factory=dict)
    variant: str = "default"
    outputs: int = 1
    domain: str = ""
    # 'stochastic': outputs are random (compare shapes/dtypes and the op's invariants only)
    stochastic: bool = False
    rtol: float = 1e-4
    atol: float = 1e-5
    # Nodes after the op when its output is not a tensor (see _follow)
    chain: Optional[dict] = None
    opset: Optional[int] = None  # model ai.onnx opset when it must differ from the default choice
    # Which node outputs are graph outputs (default: all).  ORT's training ops declare outputs
    # that only its gradient nodes read (saved statistics, gate activations): declared, unused.
    graph_outputs: Optional[List[int]] = None
    # Graph inputs the node does not take directly: its subgraphs read them from the outer
    # scope (If/Loop/Scan bodies), named cap0, cap1, ...
    captured: List[In] = field(default_factory=list)
    notes: str = ""


def _variants(op: str, base: Sequence[In], variants: Dict[str, dict], **kw) -> List[Case]:
    return [Case(op, list(base), attrs, name, **kw) for name, attrs in variants.items()]


X = (2, 3, 4)

_UNARY_RANGES: Dict[str, In] = {
    "Abs": A(*X),
    "Neg": F(*X),
    "Exp": F(*X),
    "Log": P(*X),
    "Sqrt": P(*X),
    "Reciprocal": A(*X, lo=0.5),
    "Sigmoid": F(*X),
    "Tanh": F(*X),
    "Relu": A(*X),
    "Ceil": U(*X, lo=-3, hi=3),
    "Floor": U(*X, lo=-3, hi=3),
    "Round": U(*X, lo=-3, hi=3),
    "Sign": A(*X),
    "Sin": F(*X),
    "Cos": F(*X),
    "Tan": U(*X),
    "Asin": U(*X, lo=-0.9, hi=0.9),
    "Acos": U(*X, lo=-0.9, hi=0.9),
    "Atan": F(*X),
    "Sinh": F(*X),
    "Cosh": F(*X),
    "Asinh": F(*X),
    "Acosh": P(*X, lo=1.2, hi=3.0),
    "Atanh": U(*X, lo=-0.9, hi=0.9),
    "Erf": F(*X),
    "Softplus": F(*X),
    "Softsign": F(*X),
    "Elu": A(*X),
    "Selu": A(*X),
    "Celu": A(*X),
    "LeakyRelu": A(*X),
    "HardSigmoid": A(*X, lo=0.1, hi=2.0),
    "HardSwish": A(*X, lo=0.2, hi=2.5),
    "ThresholdedRelu": U(*X, lo=-3, hi=3),
    "Mish": F(*X),
    "Identity": F(*X),
    "Softmax": F(*X),
    "LogSoftmax": F(*X),
    "Hardmax": F(*X),
    "IsNaN": F(*X),
    "NonZero": A(*X),
    "Shape": F(*X),
    "Size": F(*X),
    "GlobalAveragePool": F(2, 3, 4, 5),
    "GlobalMaxPool": F(2, 3, 4, 5),
}


def _unary(op: str, version: int) -> List[Case]:
    x = _UNARY_RANGES.get(op, F(*X))
    if version < 6 and op in _CONSUMED_INPUTS:
        return [Case(op, [x], {"consumed_inputs": [0]} if op != "BatchNormalization" else {})]
    return [Case(op, [x])]


# ops whose version 1 schema carries the legacy 'consumed_inputs' attribute (optional)
_CONSUMED_INPUTS = {
    "Abs",
    "Neg",
    "Exp",
    "Log",
    "Sqrt",
    "Reciprocal",
    "Sigmoid",
    "Tanh",
    "Relu",
    "Ceil",
    "Floor",
    "Elu",
    "Selu",
    "LeakyRelu",
    "HardSigmoid",
}


def _activation_params(op: str, version: int) -> List[Case]:
    x = _UNARY_RANGES[op]
    variants = {
        "Elu": {"alpha0.5": {"alpha": 0.5}},
        "Selu": {"alpha_gamma": {"alpha": 1.5, "gamma": 1.2}},
        "Celu": {"alpha2": {"alpha": 2.0}},
        "LeakyRelu": {"alpha0.2": {"alpha": 0.2}},
        "HardSigmoid": {"alpha_beta": {"alpha": 0.3, "beta": 0.4}},
        "ThresholdedRelu": {"alpha0.5": {"alpha": 0.5}},
    }[op]
    cases = _unary(op, version)
    cases += _variants(op, [x], variants)
    return cases


def _softmax(op: str, version: int) -> List[Case]:
    cases = [Case(op, [F(*X)])]
    cases += _variants(op, [F(*X)], {"axis0": {"axis": 0}, "axis1": {"axis": 1}})
    if version >= 11:
        cases.append(Case(op, [F(*X)], {"axis": -2}, "axis-2"))
    return cases


def _binary(op: str, version: int) -> List[Case]:
    first = A(*X) if op == "Div" else F(*X)
    second = A(*X, lo=0.5) if op == "Div" else F(*X)
    if op == "Pow":
        first, second = P(*X), U(*X, lo=-2, hi=2)
    if version < 7:
        cases = [Case(op, [first, second], {}, "same_shape")]
        cases.append(Case(op, [first, A(4, lo=0.5) if op == "Div" else F(4)], {"broadcast": 1}, "broadcast_trailing"))
        cases.append(
            Case(op, [first, A(3, lo=0.5) if op == "Div" else F(3)], {"broadcast": 1, "axis": 1}, "broadcast_axis1")
        )
        return cases
    cases = [Case(op, [first, second], {}, "same_shape")]
    cases.append(
        Case(
            op,
            [first, A(3, 1, lo=0.5) if op in ("Div",) else (U(3, 1, lo=-2, hi=2) if op == "Pow" else F(3, 1))],
            {},
            "broadcast",
        )
    )
    if op == "Pow":
        cases.append(Case(op, [first, Fv([2.0])], {}, "const_square"))
    return cases


def _variadic(op: str, version: int) -> List[Case]:
    a, b, c = (A(*X) if op in ("Max", "Min") else F(*X)), F(*X), F(*X)
    cases = [Case(op, [a], {}, "one"), Case(op, [a, b], {}, "two"), Case(op, [a, b, c], {}, "three")]
    if version >= 8:
        cases.append(Case(op, [a, F(3, 1)], {}, "broadcast"))
    return cases


def _compare(op: str, version: int) -> List[Case]:
    if op == "Equal" and version < 11:  # floats only from Equal-11
        ints = IR(*X, lo=0, hi=3)
        if version < 7:
            return [Case(op, [ints, ints]), Case(op, [ints, IR(4, lo=0, hi=3)], {"broadcast": 1}, "broadcast")]
        return [Case(op, [ints, ints]), Case(op, [ints, IR(3, 1, lo=0, hi=3)], {}, "broadcast")]
    if version < 7:
        return [Case(op, [F(*X), F(*X)]), Case(op, [F(*X), F(4)], {"broadcast": 1}, "broadcast")]
    return [Case(op, [F(*X), F(*X)]), Case(op, [F(*X), F(3, 1)], {}, "broadcast")]


def _logical(op: str, version: int) -> List[Case]:
    if op == "Not":
        return [Case(op, [B(*X)])]
    if version < 7:
        return [Case(op, [B(*X), B(*X)]), Case(op, [B(*X), B(4)], {"broadcast": 1}, "broadcast")]
    return [Case(op, [B(*X), B(*X)]), Case(op, [B(*X), B(3, 1)], {}, "broadcast")]


def _bitwise(op: str, version: int) -> List[Case]:
    a = IR(*X, lo=0, hi=64, dtype="int32")
    if op == "BitwiseNot":
        return [Case(op, [a])]
    if op == "BitShift":
        return [
            Case(op, [IR(*X, lo=0, hi=64, dtype="uint32"), IR(*X, lo=0, hi=4, dtype="uint32")], {"direction": d}, d)
            for d in ("LEFT", "RIGHT")
        ]
    return [Case(op, [a, IR(*X, lo=0, hi=64, dtype="int32")])]


def _mod(op: str, version: int) -> List[Case]:
    return [
        Case(op, [U(*X, lo=-5, hi=5), A(*X, lo=0.7, hi=2.0)], {"fmod": 1}, "fmod"),
        Case(op, [IR(*X, lo=-20, hi=20), IR(*X, lo=1, hi=6)], {}, "int"),
    ]


def _prelu(op: str, version: int) -> List[Case]:
    x = A(2, 3, 4, 5)
    cases = [Case(op, [x, F(2, 3, 4, 5)], {}, "same_shape")]
    if version >= 7:
        cases.append(Case(op, [x, F(3, 1, 1)], {}, "per_channel"))
        cases.append(Case(op, [x, F(5)], {}, "trailing"))
    else:
        cases.append(Case(op, [x, F(3)], {}, "per_channel"))
    return cases


def _where(op: str, version: int) -> List[Case]:
    return [Case(op, [B(*X), F(*X), F(*X)]), Case(op, [B(3, 1), F(*X), F(4)], {}, "broadcast")]


def _clip(op: str, version: int) -> List[Case]:
    x = U(*X, lo=-3, hi=3)
    if version < 11:
        return [Case(op, [x], {"min": -1.0, "max": 1.5}, "min_max"), Case(op, [x], {"max": 1.0}, "max_only")]
    return [
        Case(op, [x, Fv(-1.0), Fv(1.5)], {}, "min_max"),
        Case(op, [x, NONE, Fv(1.0)], {}, "max_only"),
        Case(op, [x, Fv(-0.5)], {}, "min_only"),
        Case(op, [x], {}, "no_bounds"),
    ]


def _matmul(op: str, version: int) -> List[Case]:
    return [
        Case(op, [F(3, 4), F(4, 5)], {}, "2d"),
        Case(op, [F(2, 3, 4), F(4, 5)], {}, "batched_x_2d"),
        Case(op, [F(2, 3, 4), F(2, 4, 5)], {}, "batched"),
        Case(op, [F(4), F(4, 5)], {}, "vector_x_matrix"),
        Case(op, [F(2, 3, 4), F(4)], {}, "matrix_x_vector"),
    ]


def _gemm(op: str, version: int) -> List[Case]:
    legacy = {"broadcast": 1} if version < 7 else {}
    cases = [
        Case(op, [F(3, 4), F(4, 5), F(3, 5)], {}, "plain"),
        Case(op, [F(3, 4), F(5, 4), F(5)], dict(legacy, transB=1), "transB_bias"),
        Case(op, [F(4, 3), F(4, 5), F(1, 5)], dict(legacy, transA=1, alpha=0.5, beta=2.0), "transA_alpha_beta"),
        Case(op, [F(4, 3), F(5, 4), Fv(0.5, role="data")], dict(legacy, transA=1, transB=1), "both_scalar_c"),
    ]
    if version >= 11:
        cases.append(Case(op, [F(3, 4), F(4, 5)], {}, "no_c"))
    return cases


def _einsum(op: str, version: int) -> List[Case]:
    return [
        Case(op, [F(2, 3, 4), F(2, 4, 5)], {"equation": "bij,bjk->bik"}, "bmm"),
        Case(op, [F(3, 4)], {"equation": "ij->ji"}, "transpose"),
        Case(op, [F(3, 4), F(4)], {"equation": "ij,j->i"}, "matvec"),
        Case(op, [F(2, 3, 4)], {"equation": "bij->b"}, "sum"),
    ]


def _conv(op: str, version: int) -> List[Case]:
    x2, w2 = F(2, 4, 6, 6), F(6, 4, 3, 3)
    cases = [
        Case(op, [x2, w2], {}, "2d"),
        Case(op, [x2, w2, F(6)], {"pads": [1, 1, 1, 1], "strides": [2, 2]}, "2d_bias_pads_strides"),
        Case(op, [x2, w2], {"pads": [0, 1, 2, 1]}, "2d_asym_pads"),
        Case(op, [x2, w2], {"dilations": [2, 2]}, "2d_dilations"),
        Case(op, [x2, F(6, 2, 3, 3)], {"group": 2}, "2d_group"),
        Case(op, [x2, F(4, 1, 3, 3)], {"group": 4}, "2d_depthwise"),
        Case(op, [x2, w2], {"auto_pad": "SAME_UPPER", "strides": [2, 2]}, "2d_same_upper"),
        Case(op, [x2, F(6, 4, 2, 2)], {"auto_pad": "SAME_LOWER"}, "2d_same_lower"),
        Case(op, [x2, w2], {"auto_pad": "VALID", "strides": [2, 1]}, "2d_valid"),
        Case(op, [F(2, 3, 7), F(4, 3, 3), F(4)], {"pads": [1, 2]}, "1d"),
        Case(op, [F(1, 2, 4, 4, 4), F(3, 2, 2, 2, 2)], {"strides": [1, 2, 1]}, "3d"),
        Case(op, [x2, w2], {"kernel_shape": [3, 3]}, "2d_kernel_shape_attr"),
    ]
    return cases


def _conv_transpose(op: str, version: int) -> List[Case]:
    x, w = F(2, 4, 3, 3), F(4, 3, 3, 3)
    return [
        Case(op, [x, w], {}, "2d"),
        Case(op, [x, w, F(3)], {"strides": [2, 2], "pads": [1, 1, 1, 1]}, "2d_bias_strides_pads"),
        Case(op, [x, w], {"strides": [2, 2], "output_padding": [1, 1]}, "2d_output_padding"),
        Case(op, [x, w], {"strides": [2, 2], "output_shape": [8, 8]}, "2d_output_shape"),
        Case(op, [x, w], {"dilations": [2, 2]}, "2d_dilations"),
        Case(op, [x, F(4, 2, 3, 3)], {"group": 2}, "2d_group"),
        Case(op, [x, w], {"strides": [2, 2], "auto_pad": "SAME_UPPER"}, "2d_same_upper"),
        Case(op, [x, w], {"strides": [2, 2], "auto_pad": "SAME_LOWER"}, "2d_same_lower"),
        Case(op, [x, w], {"pads": [0, 1, 1, 0]}, "2d_asym_pads"),
        Case(op, [F(2, 3, 5), F(3, 2, 3)], {"strides": [2]}, "1d"),
    ]


def _pool(op: str, version: int) -> List[Case]:
    x = F(2, 3, 7, 7)
    avg = op == "AveragePool"
    cases = [
        Case(op, [x], {"kernel_shape": [3, 3]}, "k3"),
        Case(op, [x], {"kernel_shape": [3, 3], "strides": [2, 2]}, "k3_s2"),
        Case(op, [x], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, "pads_sym"),
        Case(op, [x], {"kernel_shape": [3, 3], "pads": [0, 1, 2, 1], "strides": [2, 2]}, "pads_asym"),
        Case(op, [x], {"kernel_shape": [2, 2], "strides": [2, 2], "auto_pad": "SAME_UPPER"}, "same_upper"),
        Case(op, [x], {"kernel_shape": [2, 2], "strides": [2, 2], "auto_pad": "SAME_LOWER"}, "same_lower"),
        Case(op, [x], {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "VALID"}, "valid"),
        Case(op, [F(2, 3, 9)], {"kernel_shape": [3], "strides": [2], "pads": [1, 0]}, "1d"),
        Case(op, [F(1, 2, 5, 5, 5)], {"kernel_shape": [2, 2, 2], "strides": [2, 2, 2]}, "3d"),
    ]
    if avg and version >= 7:
        cases += [
            Case(op, [x], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}, "pads_sym_count_pad"),
            Case(
                op,
                [x],
                {"kernel_shape": [3, 3], "pads": [0, 1, 2, 1], "strides": [2, 2], "count_include_pad": 1},
                "pads_asym_count_pad",
            ),
            Case(
                op,
                [x],
                {"kernel_shape": [3, 3], "pads": [2, 0, 1, 1], "count_include_pad": 0},
                "pads_asym_no_count_pad",
            ),
            Case(
                op,
                [x],
                {"kernel_shape": [2, 2], "strides": [2, 2], "auto_pad": "SAME_UPPER", "count_include_pad": 1},
                "same_upper_count_pad",
            ),
        ]
    if version >= 10:
        cases += [
            Case(op, [x], {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}, "ceil"),
            Case(
                op,
                [F(2, 3, 8, 8)],
                {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1},
                "ceil_pads",
            ),
        ]
        if avg:
            cases.append(
                Case(
                    op,
                    [F(2, 3, 8, 8)],
                    {
                        "kernel_shape": [3, 3],
                        "strides": [2, 2],
                        "pads": [1, 1, 1, 1],
                        "ceil_mode": 1,
                        "count_include_pad": 1,
                    },
                    "ceil_pads_count_pad",
                )
            )
    if (not avg and version >= 8) or (avg and version >= 19):
        if not avg and version >= 10:
            cases.append(Case(op, [x], {"kernel_shape": [2, 2], "dilations": [2, 2]}, "dilations"))
        elif avg:
            cases.append(Case(op, [x], {"kernel_shape": [2, 2], "dilations": [2, 2]}, "dilations"))
            cases.append(
                Case(
                    op,
                    [x],
                    {"kernel_shape": [2, 2], "dilations": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1},
                    "dilations_pads_count_pad",
                )
            )
    if not avg and version >= 8:
        cases.append(Case(op, [x], {"kernel_shape": [3, 3], "strides": [2, 2]}, "with_indices", outputs=2))
    return cases


def _lp_pool(op: str, version: int) -> List[Case]:
    x = A(2, 3, 6, 6)
    cases = [
        Case(op, [x], {"kernel_shape": [2, 2], "strides": [2, 2]}, "p2"),
        Case(op, [x], {"kernel_shape": [3, 3], "p": 1 if version >= 2 else 1.0}, "p1"),
        Case(op, [x], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}, "pads"),
    ]
    if version >= 18:
        cases.append(Case(op, [x], {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}, "ceil"))
        cases.append(Case(op, [x], {"kernel_shape": [2, 2], "dilations": [2, 2]}, "dilations"))
    return cases


def _global_lp(op: str, version: int) -> List[Case]:
    x = A(2, 3, 4, 5)
    return [Case(op, [x]), Case(op, [x], {"p": 1 if version >= 2 else 1.0}, "p1")]


def _batch_norm(op: str, version: int) -> List[Case]:
    x, s, b, m, v = F(4, 3, 2, 2), F(3), F(3), F(3, role="const"), P(3, role="const")
    legacy = {}
    if version < 6:
        legacy = {"consumed_inputs": [0, 0, 0, 1, 1], "is_test": 1}
    elif version < 7:
        legacy = {"is_test": 1}
    cases = [
        Case(op, [x, s, b, m, v], legacy, "inference"),
        Case(op, [x, s, b, m, v], dict(legacy, epsilon=1e-3), "epsilon"),
        Case(op, [F(4, 3), s, b, m, v], legacy, "2d_input"),
    ]
    if version < 9:
        cases.append(Case(op, [x, s, b, m, v], dict(legacy, spatial=1), "spatial1"))
    if version >= 14:  # running-stat outputs declared, as exporters write them, but unused
        cases.append(
            Case(
                op,
                [x, s, b, m, v],
                {"training_mode": 1, "momentum": 0.8},
                "training_mode",
                outputs=3,
                graph_outputs=[0],
            )
        )
    return cases


def _instance_norm(op: str, version: int) -> List[Case]:
    legacy = {"consumed_inputs": [0, 0, 0]} if version < 6 else {}
    return [
        Case(op, [F(2, 3, 4, 5), F(3), F(3)], legacy),
        Case(op, [F(2, 3, 6), F(3), F(3)], dict(legacy, epsilon=1e-3), "3d"),
    ]


def _layer_norm(op: str, version: int) -> List[Case]:
    # The statistics outputs declared but unused, as in training graphs (ORT's gradient builder
    # reads them: without, "i < node_->OutputDefs().size()").
    stats = {"outputs": 3, "graph_outputs": [0]}
    return [
        Case(op, [F(*X), F(4), F(4)], {}, "last_axis", **stats),
        Case(op, [F(*X), F(3, 4), F(3, 4)], {"axis": 1}, "axis1", **stats),
        Case(op, [F(*X), F(4)], {"axis": -1, "epsilon": 1e-3}, "no_bias", **stats),
        Case(op, [F(*X), F(4), F(4)], {}, "no_statistics_outputs"),
    ]


def _group_norm(op: str, version: int) -> List[Case]:
    if version < 21:  # scale/bias per group
        return [
            Case(op, [F(2, 4, 3, 3), F(2), F(2)], {"num_groups": 2}),
            Case(op, [F(2, 6, 5), F(3), F(3)], {"num_groups": 3}, "3d"),
        ]
    return [
        Case(op, [F(2, 4, 3, 3), F(4), F(4)], {"num_groups": 2}),
        Case(op, [F(2, 6, 5), F(6), F(6)], {"num_groups": 3, "stash_type": 1}, "3d"),
    ]


def _lrn(op: str, version: int) -> List[Case]:
    return [
        Case(op, [F(2, 5, 3, 3)], {"size": 3}),
        Case(op, [F(2, 5, 3, 3)], {"size": 5, "alpha": 0.01, "beta": 0.5, "bias": 2.0}, "params"),
    ]


def _mvn(op: str, version: int) -> List[Case]:
    return [Case(op, [F(2, 3, 4, 5)]), Case(op, [F(2, 3, 4, 5)], {"axes": [1, 2, 3]}, "axes123")]


def _lp_norm(op: str, version: int) -> List[Case]:
    return [Case(op, [A(*X)]), Case(op, [A(*X)], {"p": 1, "axis": 1}, "p1_axis1")]


def _flatten(op: str, version: int) -> List[Case]:
    cases = [
        Case(op, [F(2, 3, 4, 5)]),
        Case(op, [F(2, 3, 4, 5)], {"axis": 0}, "axis0"),
        Case(op, [F(2, 3, 4, 5)], {"axis": 2}, "axis2"),
        Case(op, [F(2, 3, 4, 5)], {"axis": 4}, "axis_rank"),
    ]
    if version >= 11:
        cases.append(Case(op, [F(2, 3, 4, 5)], {"axis": -1}, "axis-1"))
    return cases


def _reshape(op: str, version: int) -> List[Case]:
    if version < 5:
        return [Case(op, [F(*X)], {"shape": [6, 4]}), Case(op, [F(*X)], {"shape": [0, -1]}, "zero_minus1")]
    cases = [
        Case(op, [F(*X), I([6, 4])]),
        Case(op, [F(*X), I([0, -1])], {}, "zero_minus1"),
        Case(op, [F(*X), I([4, 6], role="data")], {}, "shape_fed"),
    ]
    if version >= 14:
        cases.append(Case(op, [F(*X), I([3, 2, 4])], {"allowzero": 1}, "allowzero"))
    return cases


def _transpose(op: str, version: int) -> List[Case]:
    return [
        Case(op, [F(*X)]),
        Case(op, [F(*X)], {"perm": [1, 0, 2]}, "perm102"),
        Case(op, [F(*X)], {"perm": [2, 0, 1]}, "perm201"),
    ]


def _squeeze(op: str, version: int) -> List[Case]:
    x = F(2, 1, 4, 1)
    if version < 13:
        cases = [Case(op, [x]), Case(op, [x], {"axes": [1]}, "axes1")]
        if version >= 11:
            cases.append(Case(op, [x], {"axes": [-1]}, "axes-1"))
        return cases
    return [
        Case(op, [x]),
        Case(op, [x, I([1])], {}, "axes1"),
        Case(op, [x, I([-1, 1])], {}, "axes-1_1"),
        Case(op, [x, I([3], role="data")], {}, "axes_fed"),
    ]


def _unsqueeze(op: str, version: int) -> List[Case]:
    x = F(2, 4)
    if version < 13:
        cases = [Case(op, [x], {"axes": [0]}, "axes0"), Case(op, [x], {"axes": [1, 3]}, "axes13")]
        if version >= 11:
            cases.append(Case(op, [x], {"axes": [-1]}, "axes-1"))
        return cases
    return [
        Case(op, [x, I([0])], {}, "axes0"),
        Case(op, [x, I([1, 3])], {}, "axes13"),
        Case(op, [x, I([-1])], {}, "axes-1"),
        Case(op, [x, I([2], role="data")], {}, "axes_fed"),
    ]


def _concat(op: str, version: int) -> List[Case]:
    cases = [
        Case(op, [F(2, 3, 4), F(2, 2, 4)], {"axis": 1}, "axis1"),
        Case(op, [F(2, 3, 4), F(2, 3, 4), F(2, 3, 1)], {"axis": 2}, "three"),
    ]
    if version < 4:
        cases.append(Case(op, [F(2, 3, 4), F(2, 2, 4)], {}, "default_axis"))
    if version >= 11:
        cases.append(Case(op, [F(2, 3, 4), F(2, 3, 2)], {"axis": -1}, "axis-1"))
    return cases


def _split(op: str, version: int) -> List[Case]:
    x = F(2, 6, 4)
    if version < 2:
        return [
            Case(op, [x], {"axis": 1}, "equal", outputs=2),
            Case(op, [x], {"axis": 1, "split": [2, 4]}, "sizes", outputs=2),
            Case(op, [x, I([1, 5])], {"axis": 1}, "sizes_input", outputs=2),
        ]
    if version < 13:
        cases = [
            Case(op, [x], {"axis": 1}, "equal", outputs=3),
            Case(op, [x], {"axis": 1, "split": [2, 4]}, "sizes", outputs=2),
        ]
        if version >= 11:
            cases.append(Case(op, [x], {"axis": -1, "split": [1, 3]}, "axis-1", outputs=2))
        return cases
    equal = {"axis": 1, "num_outputs": 3} if version >= 18 else {"axis": 1}
    cases = [
        Case(op, [x], equal, "equal", outputs=3),
        Case(op, [x, I([2, 4])], {"axis": 1}, "sizes", outputs=2),
        Case(op, [x, I([1, 3])], {"axis": -1}, "axis-1", outputs=2),
    ]
    if version >= 18:
        cases.append(Case(op, [F(2, 7, 4)], {"axis": 1, "num_outputs": 3}, "num_outputs_uneven", outputs=3))
    return cases


def _slice(op: str, version: int) -> List[Case]:
    x = F(4, 5, 6)
    if version < 10:
        return [
            Case(op, [x], {"starts": [1, 0], "ends": [3, 4], "axes": [0, 2]}, "axes"),
            Case(op, [x], {"starts": [0, 1, 2], "ends": [2, 100, -1]}, "no_axes"),
        ]
    cases = [
        Case(op, [x, I([1, 0]), I([3, 4]), I([0, 2])], {}, "axes"),
        Case(op, [x, I([0, 1, 2]), I([2, 100, -1])], {}, "no_axes"),
        Case(op, [x, I([4, 0]), I([0, 6]), I([1, 2]), I([-1, 2])], {}, "steps_neg"),
        Case(op, [x, I([1], role="data"), I([3], role="data"), I([1])], {}, "fed_starts_ends"),
    ]
    if version >= 11:
        cases.append(Case(op, [x, I([-3]), I([-1]), I([-1])], {}, "neg_axes"))
    return cases


def _gather(op: str, version: int) -> List[Case]:
    x = F(4, 5, 3)
    cases = [
        Case(op, [x, I([[0, 2], [3, 1]])], {}, "axis0"),
        Case(op, [x, I([1, 0, 4])], {"axis": 1}, "axis1"),
        Case(op, [x, IR(2, 2, lo=0, hi=3)], {"axis": 2}, "indices_fed"),
    ]
    if version >= 11:
        cases.append(Case(op, [x, I([-1, 0])], {"axis": -2}, "negative"))
    return cases


def _gather_elements(op: str, version: int) -> List[Case]:
    x = F(3, 4)
    return [
        Case(op, [x, I([[0, 2, 1, 0], [2, 1, 0, 0]])], {}, "axis0"),
        Case(op, [x, I([[1, 3], [0, 0], [3, -1]])], {"axis": 1}, "axis1"),
    ]


def _gather_nd(op: str, version: int) -> List[Case]:
    cases = [
        Case(op, [F(3, 4, 2), I([[0, 1], [2, 3]])], {}, "pairs"),
        Case(op, [F(3, 4, 2), I([[1], [0]])], {}, "rows"),
    ]
    if version >= 12:
        cases.append(Case(op, [F(2, 3, 4), I([[1], [2]])], {"batch_dims": 1}, "batch_dims"))
    return cases


def _scatter_elements(op: str, version: int) -> List[Case]:
    data, upd = F(3, 4), F(2, 4)
    idx = I([[0, 2, 1, 0], [2, 1, 0, 1]])
    cases = [
        Case(op, [data, idx, upd], {}, "axis0"),
        Case(op, [data, I([[1, 3], [0, 2], [3, 0]]), F(3, 2)], {"axis": 1}, "axis1"),
    ]
    if op == "ScatterElements" and version >= 16:
        cases.append(Case(op, [data, I([[0, 2, 1, 0], [0, 1, 0, 1]]), upd], {"reduction": "add"}, "add"))
        cases.append(Case(op, [data, I([[0, 2, 1, 0], [0, 1, 0, 1]]), upd], {"reduction": "mul"}, "mul"))
    if op == "ScatterElements" and version >= 18:
        cases.append(Case(op, [data, I([[0, 2, 1, 0], [0, 1, 0, 1]]), upd], {"reduction": "max"}, "max"))
    return cases


def _scatter_nd(op: str, version: int) -> List[Case]:
    cases = [
        Case(op, [F(4, 3), I([[1], [3]]), F(2, 3)], {}, "rows"),
        Case(op, [F(4, 3), I([[0, 1], [2, 2]]), F(2)], {}, "elements"),
    ]
    if version >= 16:
        cases.append(Case(op, [F(4, 3), I([[1], [1]]), F(2, 3)], {"reduction": "add"}, "add"))
    if version >= 18:
        cases.append(Case(op, [F(4, 3), I([[1], [1]]), F(2, 3)], {"reduction": "min"}, "min"))
    return cases


def _pad(op: str, version: int) -> List[Case]:
    x = F(2, 3, 4, 4)
    if version < 11:
        key = "paddings" if version < 2 else "pads"
        return [
            Case(op, [x], {key: [0, 0, 1, 2, 0, 0, 2, 1]}, "constant0"),
            Case(op, [x], {key: [0, 0, 1, 2, 0, 0, 2, 1], "value": 1.5}, "constant_value"),
            Case(op, [x], {key: [0, 0, 1, 2, 0, 0, 2, 1], "mode": "reflect"}, "reflect"),
            Case(op, [x], {key: [0, 0, 1, 2, 0, 0, 2, 1], "mode": "edge"}, "edge"),
        ]
    pads = I([0, 0, 1, 2, 0, 0, 2, 1])
    cases = [
        Case(op, [x, pads], {}, "constant0"),
        Case(op, [x, pads, Fv(1.5)], {}, "constant_value"),
        Case(op, [x, pads], {"mode": "reflect"}, "reflect"),
        Case(op, [x, pads], {"mode": "edge"}, "edge"),
        Case(op, [x, I([0, 0, -1, 1, 0, 0, 1, -1])], {}, "negative_pads"),
        Case(op, [x, I([0, 0, 1, 1, 0, 0, 1, 1], role="data")], {}, "pads_fed"),
    ]
    if version >= 18:
        cases.append(Case(op, [x, I([1, 2, 2, 1]), Fv(0.5), I([2, 3])], {}, "axes"))
        cases.append(Case(op, [x, I([1, 2]), NONE, I([-1])], {"mode": "reflect"}, "axes_negative"))
    if version >= 19:
        cases.append(Case(op, [x, pads], {"mode": "wrap"}, "wrap"))
    return cases


def _expand(op: str, version: int) -> List[Case]:
    return [
        Case(op, [F(3, 1), I([2, 3, 4])]),
        Case(op, [F(2, 3, 4), I([3, 1])], {}, "smaller_shape"),
        Case(op, [F(1, 4), I([3, 4], role="data")], {}, "shape_fed"),
    ]


def _tile(op: str, version: int) -> List[Case]:
    if version < 6:
        return [Case(op, [F(2, 3), I(2), I(1)], {}, "tiles_axis")]
    return [Case(op, [F(2, 3), I([2, 3])]), Case(op, [F(*X), I([1, 2, 1], role="data")], {}, "repeats_fed")]


def _depth_to_space(op: str, version: int) -> List[Case]:
    x = F(1, 8, 2, 3)
    cases = [Case(op, [x], {"blocksize": 2})]
    if version >= 11:
        cases.append(Case(op, [x], {"blocksize": 2, "mode": "CRD"}, "CRD"))
    return cases


def _resize(op: str, version: int) -> List[Case]:
    x = F(1, 2, 3, 4)
    if version < 11:  # (X, scales)
        return [
            Case(op, [x, Fv([1, 1, 2, 2])], {"mode": "nearest"}, "nearest"),
            Case(op, [x, Fv([1, 1, 2, 1.5])], {"mode": "linear"}, "linear"),
        ]
    roi = NONE if version >= 13 else Fv([])
    cases = []
    for mode, ctm, nearest in [
        ("nearest", "asymmetric", "floor"),
        ("nearest", "half_pixel", "round_prefer_floor"),
        ("nearest", "align_corners", "round_prefer_ceil"),
        ("linear", "half_pixel", None),
        ("linear", "align_corners", None),
        ("linear", "asymmetric", None),
        ("linear", "pytorch_half_pixel", None),
        ("cubic", "half_pixel", None),
    ]:
        attrs = {"mode": mode, "coordinate_transformation_mode": ctm}
        if nearest:
            attrs["nearest_mode"] = nearest
        cases.append(Case(op, [x, roi, Fv([1, 1, 2, 2])], attrs, f"{mode}_{ctm}"))
    cases.append(Case(op, [x, roi, NONE if version >= 13 else Fv([]), I([1, 2, 5, 7])], {"mode": "linear"}, "sizes"))
    cases.append(Case(op, [x, roi, Fv([1, 1, 0.6, 0.5])], {"mode": "linear"}, "downsample"))
    if version >= 18:
        cases.append(Case(op, [x, roi, Fv([2, 2]), NONE], {"mode": "linear", "axes": [2, 3]}, "axes"))
        cases.append(Case(op, [x, roi, Fv([1, 1, 0.6, 0.5])], {"mode": "linear", "antialias": 1}, "antialias"))
    if version >= 19:
        cases.append(
            Case(
                op,
                [x, roi, Fv([1, 1, 2, 2])],
                {"mode": "linear", "coordinate_transformation_mode": "half_pixel_symmetric"},
                "half_pixel_symmetric",
            )
        )
    return cases


def _upsample(op: str, version: int) -> List[Case]:
    x = F(1, 2, 3, 4)
    if version < 7:
        return [Case(op, [x], {"height_scale": 2.0, "width_scale": 2.0, "mode": "nearest"}, "nearest")]
    if version < 9:
        return [
            Case(op, [x], {"scales": [1.0, 1.0, 2.0, 2.0], "mode": "nearest"}, "nearest"),
            Case(op, [x], {"scales": [1.0, 1.0, 2.0, 1.5], "mode": "linear"}, "linear"),
        ]
    return [
        Case(op, [x, Fv([1, 1, 2, 2])], {"mode": "nearest"}, "nearest"),
        Case(op, [x, Fv([1, 1, 2, 1.5])], {"mode": "linear"}, "linear"),
    ]


def _reduce(op: str, version: int) -> List[Case]:
    x = P(*X) if op in ("ReduceLogSum", "ReduceProd") else (A(*X) if op in ("ReduceL1", "ReduceL2") else F(*X))
    axes_input = version >= 18 or (op == "ReduceSum" and version >= 13)
    if not axes_input:
        cases = [
            Case(op, [x], {}, "all"),
            Case(op, [x], {"axes": [1]}, "axis1"),
            Case(op, [x], {"axes": [0, 2], "keepdims": 0}, "axes02_nokeep"),
        ]
        if version >= 11:
            cases.append(Case(op, [x], {"axes": [-1]}, "axis-1"))
        return cases
    return [
        Case(op, [x], {}, "all"),
        Case(op, [x, I([1])], {}, "axis1"),
        Case(op, [x, I([0, 2])], {"keepdims": 0}, "axes02_nokeep"),
        Case(op, [x, I([-1])], {}, "axis-1"),
        Case(op, [x, I([], "int64")], {"noop_with_empty_axes": 1}, "noop_empty"),
        Case(op, [x, I([2], role="data")], {}, "axes_fed"),
    ]


def _arg(op: str, version: int) -> List[Case]:
    x = F(*X)
    cases = [Case(op, [x]), Case(op, [x], {"axis": 1, "keepdims": 0}, "axis1_nokeep")]
    if version >= 11:
        cases.append(Case(op, [x], {"axis": -1}, "axis-1"))
    if version >= 12:
        cases.append(
            Case(
                op,
                [I([[1, 3, 3], [2, 2, 0]], dtype="float32", role="data")],
                {"axis": 1, "select_last_index": 1},
                "last",
            )
        )
    return cases


def _topk(op: str, version: int) -> List[Case]:
    x = F(3, 6)
    if version < 10:
        return [Case(op, [x], {"k": 2}, "k2", outputs=2)]
    cases = [Case(op, [x, I([2])], {}, "k2", outputs=2), Case(op, [F(*X), I([2])], {"axis": 1}, "axis1", outputs=2)]
    if version >= 11:
        cases.append(Case(op, [x, I([3])], {"largest": 0}, "smallest", outputs=2))
        cases.append(Case(op, [x, I([2])], {"axis": -1, "sorted": 1}, "negative_axis", outputs=2))
    return cases


def _cast(op: str, version: int) -> List[Case]:
    cases = [
        Case(op, [F(*X)], {"to": TensorProto.DOUBLE}, "to_double"),
        Case(op, [U(*X, lo=-5, hi=5)], {"to": TensorProto.INT64}, "to_int64"),
        Case(op, [IR(*X, lo=-5, hi=5)], {"to": TensorProto.FLOAT}, "int_to_float"),
        Case(op, [F(*X)], {"to": TensorProto.FLOAT16}, "to_half"),
        Case(op, [F(*X)], {"to": TensorProto.BOOL}, "to_bool"),
    ]
    if version == 1:
        for case in cases:
            case.attrs = {
                "to": {
                    TensorProto.DOUBLE: "DOUBLE",
                    TensorProto.INT64: "INT64",
                    TensorProto.FLOAT: "FLOAT",
                    TensorProto.FLOAT16: "FLOAT16",
                    TensorProto.BOOL: "BOOL",
                }[case.attrs["to"]]
            }
    return cases


def _cast_like(op: str, version: int) -> List[Case]:
    return [
        Case(op, [IR(*X, lo=-5, hi=5), F(1)], {}, "int_to_float"),
        Case(op, [F(*X), In((1,), "values", dtype="float64", role="const", values=[1.0])], {}, "to_double"),
    ]


def _shape(op: str, version: int) -> List[Case]:
    cases = [Case(op, [F(*X)])]
    if version >= 15:
        cases += [Case(op, [F(*X)], {"start": 1}, "start1"), Case(op, [F(*X)], {"start": -2, "end": -1}, "start_end")]
    return cases


def _constant(op: str, version: int) -> List[Case]:
    from onnx import numpy_helper

    tensor = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3) / 4, "value")
    cases = [Case(op, [], {"value": tensor}, "tensor")]
    if version >= 12:
        cases += [
            Case(op, [], {"value_float": 1.5}, "value_float"),
            Case(op, [], {"value_floats": [1.0, 2.5]}, "value_floats"),
            Case(op, [], {"value_int": 3}, "value_int"),
            Case(op, [], {"value_ints": [1, 2, 3]}, "value_ints"),
        ]
    return cases


def _constant_of_shape(op: str, version: int) -> List[Case]:
    from onnx import numpy_helper

    return [
        Case(op, [I([2, 3])]),
        Case(
            op, [I([2, 3], role="data")], {"value": numpy_helper.from_array(np.array([1.5], np.float32))}, "value_fed"
        ),
    ]


def _range(op: str, version: int) -> List[Case]:
    return [
        Case(op, [Fv(0.5), Fv(3.0), Fv(0.75)]),
        Case(op, [I(1, role="data"), I(9, role="data"), I(3, role="data")], {}, "int_fed"),
    ]


def _onehot(op: str, version: int) -> List[Case]:
    return [
        Case(op, [I([[0, 2], [1, 3]]), I([4]), Fv([0.0, 1.0], role="data")]),
        Case(op, [I([0, -1, 2]), I(3), Fv([-1.0, 2.0], role="data")], {"axis": 0}, "axis0_negative_index"),
    ]


def _compress(op: str, version: int) -> List[Case]:
    return [
        Case(op, [F(3, 4), I([True, False, True], dtype="bool")], {"axis": 0}, "axis0"),
        Case(op, [F(3, 4), I([False, True, True], dtype="bool")], {}, "flattened"),
    ]


def _cumsum(op: str, version: int) -> List[Case]:
    return [
        Case(op, [F(*X), I(1)]),
        Case(op, [F(*X), I(-1)], {"exclusive": 1}, "exclusive"),
        Case(op, [F(*X), I(0)], {"reverse": 1}, "reverse"),
    ]


def _trilu(op: str, version: int) -> List[Case]:
    return [
        Case(op, [F(3, 4, 4)]),
        Case(op, [F(3, 4, 4), I(1)], {"upper": 0}, "lower_k1"),
        Case(op, [F(4, 5), I(-1)], {}, "upper_k-1"),
    ]


def _eye_like(op: str, version: int) -> List[Case]:
    return [Case(op, [F(3, 4)]), Case(op, [F(3, 4)], {"k": 1, "dtype": TensorProto.FLOAT}, "k1")]


def _det(op: str, version: int) -> List[Case]:
    return [Case(op, [F(3, 3)]), Case(op, [F(2, 3, 3)], {}, "batched")]


def _reverse_sequence(op: str, version: int) -> List[Case]:
    return [Case(op, [F(4, 3, 2), I([4, 2, 1])], {"batch_axis": 1, "time_axis": 0})]


def _space_to_depth(op: str, version: int) -> List[Case]:
    return [Case(op, [F(1, 2, 4, 6)], {"blocksize": 2})]


def _unique(op: str, version: int) -> List[Case]:
    vals = I([[2.0, 1.0, 2.0], [3.0, 1.0, 0.5]], dtype="float32", role="data")
    return [
        Case(op, [vals], {}, "flat", outputs=4),
        Case(op, [vals], {"sorted": 0}, "unsorted", outputs=4),
        Case(
            op, [I([[1.0, 2.0], [1.0, 2.0], [0.0, 3.0]], dtype="float32", role="data")], {"axis": 0}, "axis0", outputs=4
        ),
    ]


def _shrink(op: str, version: int) -> List[Case]:
    x = U(*X, lo=-2, hi=2)
    return [Case(op, [x]), Case(op, [x], {"lambd": 0.8, "bias": 0.3}, "lambd_bias")]


def _gelu(op: str, version: int) -> List[Case]:
    return [Case(op, [F(*X)]), Case(op, [F(*X)], {"approximate": "tanh"}, "tanh")]


def _dropout(op: str, version: int) -> List[Case]:
    x = F(*X)
    if version < 7:
        return [Case(op, [x], {"is_test": 1}, "is_test"), Case(op, [x], {"is_test": 1, "ratio": 0.3}, "is_test_ratio")]
    if version < 12:
        return [
            Case(op, [x], {}, "default"),
            Case(op, [x], {"ratio": 0.3}, "ratio0.3"),
            Case(op, [x], {"ratio": 0.3}, "with_mask", outputs=2),
        ]
    # The mask output is declared as exporters do: ORT's Dropout gradient builder reads it
    # whenever the ratio is an input (without it, "i < node_->OutputDefs().size()").
    return [
        Case(op, [x], {}, "no_training_mode"),
        Case(op, [x, Fv(0.3)], {}, "ratio0.3", outputs=2),
        Case(op, [x, Fv(0.3), I(False, dtype="bool")], {}, "training_false", outputs=2),
        Case(op, [x, Fv(0.3), I(True, dtype="bool")], {}, "training_true", outputs=2, stochastic=True),
        Case(op, [x, Fv(0.0), I(True, dtype="bool")], {}, "training_true_ratio0", outputs=2),
        Case(op, [x, Fv(0.5), I(True, dtype="bool")], {"seed": 7}, "seed", outputs=2, stochastic=True),
    ]


def _nll(op: str, version: int) -> List[Case]:
    scores = F(3, 5) if op == "SoftmaxCrossEntropyLoss" else F(3, 5, kind="uniform", lo=-3, hi=-0.1)
    labels = I([1, 4, 0])
    outs = 2 if op == "SoftmaxCrossEntropyLoss" else 1
    cases = [
        Case(op, [scores, labels], {}, "mean"),
        Case(op, [scores, labels], {"reduction": "sum"}, "sum"),
        Case(op, [scores, labels], {"reduction": "none"}, "none"),
        Case(op, [scores, labels, P(5, role="const")], {}, "weighted_mean"),
        Case(op, [scores, I([1, 4, -1])], {"ignore_index": -1}, "ignore_index"),
        Case(
            op,
            [F(2, 4, 3) if outs == 2 else F(2, 4, 3, kind="uniform", lo=-3, hi=-0.1), I([[0, 3, 1], [2, 2, 0]])],
            {},
            "spatial",
        ),
    ]
    if outs == 2:
        cases.append(Case(op, [scores, labels], {}, "log_prob", outputs=2))
    return cases


def _rnn(op: str, version: int) -> List[Case]:
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[op]
    seq, batch, inp, hid = 3, 2, 4, 5
    outputs = 3 if op == "LSTM" else 2

    def inputs(dirs, lengths=NONE, x_shape=(seq, batch, inp)):
        """X, W, R, B, sequence_lens, initial_h(, initial_c): exporters write the initial
        states, and ORT's LSTM/GRU gradient builders need them (without: 'Type ... of input
        parameter (y0) of operator (LSTMGrad) is invalid', measured)."""
        states = [F(dirs, batch, hid)] + ([F(dirs, batch, hid)] if op == "LSTM" else [])
        return [
            F(*x_shape),
            F(dirs, gates * hid, inp),
            F(dirs, gates * hid, hid),
            F(dirs, 2 * gates * hid),
            lengths,
        ] + states

    cases = []
    for direction, dirs in (("forward", 1), ("reverse", 1), ("bidirectional", 2)):
        cases.append(Case(op, inputs(dirs), {"hidden_size": hid, "direction": direction}, direction, outputs=outputs))
    cases.append(Case(op, inputs(1)[:3], {"hidden_size": hid}, "no_bias_no_state", outputs=1))
    cases.append(Case(op, inputs(1)[:4], {"hidden_size": hid}, "no_initial_state", outputs=outputs))
    cases.append(Case(op, inputs(1, I([3, 3], dtype="int32")), {"hidden_size": hid}, "sequence_lens_full"))
    cases.append(
        Case(op, inputs(1, I([3, 2], dtype="int32")), {"hidden_size": hid}, "sequence_lens_varying", outputs=outputs)
    )
    cases.append(
        Case(
            op,
            inputs(1, I([1, 3], dtype="int32")),
            {"hidden_size": hid, "direction": "reverse"},
            "sequence_lens_reverse",
            outputs=outputs,
        )
    )
    cases.append(Case(op, inputs(1), {"hidden_size": hid, "clip": 0.5}, "clip", outputs=outputs))
    alternative = {"RNN": ["Relu"], "GRU": ["HardSigmoid", "Softsign"], "LSTM": ["HardSigmoid", "Tanh", "Softsign"]}[op]
    cases.append(Case(op, inputs(1), {"hidden_size": hid, "activations": alternative}, "activations", outputs=outputs))
    if op == "GRU" and version >= 3:
        cases.append(
            Case(op, inputs(1), {"hidden_size": hid, "linear_before_reset": 1}, "linear_before_reset", outputs=outputs)
        )
    if op == "LSTM":
        cases.append(Case(op, inputs(1) + [F(1, 3 * hid)], {"hidden_size": hid}, "peepholes", outputs=outputs))
    if version >= 14:
        cases.append(
            Case(
                op,
                inputs(1, x_shape=(batch, seq, inp))[:4],
                {"hidden_size": hid, "layout": 1},
                "layout1",
                outputs=outputs,
            )
        )
    return cases


def _roi(op: str, version: int) -> List[Case]:
    if op == "MaxRoiPool":
        return [
            Case(op, [F(1, 2, 6, 6), Fv([[0, 0, 0, 4, 4], [0, 1, 1, 5, 3]], role="data")], {"pooled_shape": [2, 2]})
        ]
    return [
        Case(
            op,
            [F(1, 2, 6, 6), Fv([[0.5, 0.5, 4.0, 4.0], [1.0, 0.0, 5.0, 3.5]], role="data"), I([0, 0])],
            {"output_height": 2, "output_width": 2, "sampling_ratio": 2},
        )
    ]


def _grid_sample(op: str, version: int) -> List[Case]:
    grid = U(1, 3, 4, 2, lo=-0.9, hi=0.9)
    linear = "bilinear" if version < 20 else "linear"
    cubic = "bicubic" if version < 20 else "cubic"
    return [
        Case(op, [F(1, 2, 4, 5), grid], {"mode": linear}, linear),
        Case(op, [F(1, 2, 4, 5), grid], {"mode": "nearest", "align_corners": 1}, "nearest_align"),
        Case(op, [F(1, 2, 4, 5), U(1, 3, 4, 2, lo=-1.3, hi=1.3)], {"mode": linear, "padding_mode": "border"}, "border"),
        Case(op, [F(1, 2, 4, 5), grid], {"mode": cubic}, cubic),
    ]


def _affine_grid(op: str, version: int) -> List[Case]:
    return [
        Case(op, [F(2, 2, 3), I([2, 1, 3, 4])]),
        Case(op, [F(2, 2, 3), I([2, 1, 3, 4])], {"align_corners": 1}, "align_corners"),
    ]


def _col2im(op: str, version: int) -> List[Case]:
    return [Case(op, [F(1, 4, 6), I([3, 4]), I([2, 2])], {}, "basic")]


def _center_crop_pad(op: str, version: int) -> List[Case]:
    return [
        Case(op, [F(4, 5, 3), I([3, 7, 3])]),
        Case(
            op,
            [
                F(4, 5, 3),
                I([6, 2]),
            ],
            {"axes": [0, 1]},
            "axes",
        ),
    ]


def _max_unpool(op: str, version: int) -> List[Case]:
    return [Case(op, [F(1, 1, 2, 2), I([[[[1, 3], [9, 14]]]])], {"kernel_shape": [2, 2], "strides": [2, 2]})]


def _nms(op: str, version: int) -> List[Case]:
    boxes = Fv([[[0, 0, 1, 1], [0, 0.1, 1, 1.1], [0, 2, 1, 3], [0, 2.05, 1, 3.05]]], role="data")
    scores = Fv([[[0.9, 0.75, 0.6, 0.95]]], role="data")
    return [Case(op, [boxes, scores, I([2]), Fv([0.5]), Fv([0.0])])]


def _string_normalizer(op: str, version: int) -> List[Case]:
    words = S(["Hello", "monday", "World", "a"])
    # ORT's default locale en_US.UTF-8 is not installed everywhere; C.UTF-8 is
    locale = {"locale": "C.UTF-8"}
    return [
        Case(op, [words], dict(locale, case_change_action="LOWER"), "lower"),
        Case(op, [words], dict(locale, case_change_action="UPPER", stopwords=["monday"]), "upper_stopwords"),
        Case(
            op, [S([["Hello", "World"]])], dict(locale, is_case_sensitive=1, stopwords=["World"]), "2d_case_sensitive"
        ),
    ]


def _tfidf(op: str, version: int) -> List[Case]:
    tokens = I([[1, 1, 3, 3, 3, 7], [8, 6, 7, 5, 6, 8]], dtype="int32", role="data")
    pool = {
        "ngram_counts": [0, 4],
        "ngram_indexes": [0, 1, 2, 3, 4, 5, 6],
        "pool_int64s": [2, 3, 5, 4, 5, 6, 7, 8, 6, 7],
    }
    return [
        Case(op, [tokens], dict(pool, max_gram_length=2, max_skip_count=0, min_gram_length=2, mode="TF"), "bigrams"),
        Case(op, [tokens], dict(pool, max_gram_length=2, max_skip_count=2, min_gram_length=1, mode="TF"), "skips"),
        Case(
            op,
            [tokens],
            dict(
                pool,
                max_gram_length=2,
                max_skip_count=0,
                min_gram_length=1,
                mode="TFIDF",
                weights=[0.5, 1.0, 2.0, 1.5, 0.25, 3.0, 1.0],
            ),
            "tfidf",
        ),
        Case(
            op,
            [S(["a", "b", "a", "c"])],
            {
                "max_gram_length": 1,
                "max_skip_count": 0,
                "min_gram_length": 1,
                "mode": "IDF",
                "ngram_counts": [0],
                "ngram_indexes": [0, 1],
                "pool_strings": ["a", "c"],
            },
            "strings",
        ),
    ]


def _regex(op: str, version: int) -> List[Case]:
    return [
        Case(op, [S(["www.google.com", "www.facebook.com", "www.bbc.co.uk"])], {"pattern": r"www\.[\w.-]+\.\bcom\b"})
    ]


def _string_concat(op: str, version: int) -> List[Case]:
    return [Case(op, [S(["abc", "de"]), S(["x", "yz"])])]


def _string_split(op: str, version: int) -> List[Case]:
    return [Case(op, [S(["a b c", "hello world"])], {}, "default", outputs=2)]


def _dequantize(op: str, version: int) -> List[Case]:
    return [
        Case(op, [IR(*X, lo=0, hi=255, dtype="uint8"), Fv(0.5), I(10, dtype="uint8")]),
        Case(op, [IR(*X, lo=-100, hi=100, dtype="int8"), Fv(0.25)], {}, "int8_no_zero_point"),
    ]


def _quantize(op: str, version: int) -> List[Case]:
    return [
        Case(op, [U(*X, lo=-10, hi=50), Fv(0.5), I(10, dtype="uint8")]),
        Case(op, [U(*X, lo=-10, hi=10), Fv(0.25), I(0, dtype="int8")], {}, "int8"),
    ]


def _dynamic_quantize(op: str, version: int) -> List[Case]:
    return [Case(op, [U(*X, lo=-3, hi=5)], {}, "default", outputs=3)]


def _qlinear_matmul(op: str, version: int) -> List[Case]:
    return [
        Case(
            op,
            [
                IR(3, 4, lo=0, hi=255, dtype="uint8"),
                Fv(0.05),
                I(120, dtype="uint8"),
                IR(4, 2, lo=0, hi=255, dtype="uint8"),
                Fv(0.04),
                I(130, dtype="uint8"),
                Fv(0.5),
                I(128, dtype="uint8"),
            ],
        )
    ]


def _matmul_integer(op: str, version: int) -> List[Case]:
    return [
        Case(
            op,
            [
                IR(3, 4, lo=0, hi=255, dtype="uint8"),
                IR(4, 2, lo=0, hi=255, dtype="uint8"),
                I(12, dtype="uint8"),
                I(0, dtype="uint8"),
            ],
        )
    ]


def _conv_integer(op: str, version: int) -> List[Case]:
    return [
        Case(
            op,
            [
                IR(1, 2, 4, 4, lo=0, hi=255, dtype="uint8"),
                IR(3, 2, 2, 2, lo=0, hi=255, dtype="uint8"),
                I(3, dtype="uint8"),
            ],
        )
    ]


def _qlinear_conv(op: str, version: int) -> List[Case]:
    return [
        Case(
            op,
            [
                IR(1, 2, 4, 4, lo=0, hi=255, dtype="uint8"),
                Fv(0.05),
                I(120, dtype="uint8"),
                IR(3, 2, 2, 2, lo=0, hi=255, dtype="uint8"),
                Fv(0.02),
                I(128, dtype="uint8"),
                Fv(0.5),
                I(100, dtype="uint8"),
            ],
        )
    ]


def _random(op: str, version: int) -> List[Case]:
    if op in ("RandomNormal", "RandomUniform"):
        return [Case(op, [], {"shape": [3, 4]}, stochastic=True)]
    if op in ("RandomNormalLike", "RandomUniformLike"):
        return [Case(op, [F(3, 4)], {}, stochastic=True)]
    if op == "Bernoulli":
        return [Case(op, [U(3, 4, lo=0.1, hi=0.9)], {}, stochastic=True)]
    if op == "Multinomial":
        return [Case(op, [F(2, 5)], {"sample_size": 3}, stochastic=True)]
    raise KeyError(op)


def _window(op: str, version: int) -> List[Case]:
    return [Case(op, [I(8, dtype="int64")]), Case(op, [I(7, dtype="int64")], {"periodic": 0}, "symmetric")]


def _mel(op: str, version: int) -> List[Case]:
    return [Case(op, [I(4), I(16), I(8000), Fv(100.0), Fv(3000.0)])]


def _dft(op: str, version: int) -> List[Case]:
    if version < 20:
        return [
            Case(op, [F(2, 8, 1)], {"axis": 1}, "real"),
            Case(op, [F(2, 8, 2)], {"axis": 1, "inverse": 1}, "inverse"),
        ]
    return [
        Case(op, [F(2, 8, 1), NONE, I(1)], {}, "real"),
        Case(op, [F(2, 8, 2), NONE, I(1)], {"inverse": 1}, "inverse"),
    ]


def _stft(op: str, version: int) -> List[Case]:
    return [Case(op, [F(1, 16, 1), I(4), NONE, I(8)], {}, "basic")]


def _optional(op: str, version: int) -> List[Case]:
    follow = "OptionalHasElement" if op == "OptionalHasElement" else "OptionalGetElement"
    return [Case("Optional", [F(*X)], {}, follow, chain=_follow(follow))]


def _sequence_cases(op: str, version: int) -> List[Case]:
    if op == "SequenceConstruct":
        return [
            Case(op, [F(2, 3), F(2, 3)], {}, "concat", chain=_follow("ConcatFromSequence", attrs={"axis": 0})),
            Case(op, [F(2, 3), F(1, 3)], {}, "at_1", chain=_follow("SequenceAt", [I(1)])),
        ]
    if op == "SequenceAt":
        return [Case("SequenceConstruct", [F(2, 3), F(4, 3)], {}, "at_neg1", chain=_follow("SequenceAt", [I(-1)]))]
    if op == "ConcatFromSequence":
        return [
            Case(
                "SequenceConstruct",
                [F(2, 3), F(2, 3)],
                {},
                "axis1",
                chain=_follow("ConcatFromSequence", attrs={"axis": 1}),
            ),
            Case(
                "SequenceConstruct",
                [F(2, 3), F(2, 3)],
                {},
                "new_axis",
                chain=_follow("ConcatFromSequence", attrs={"axis": 0, "new_axis": 1}),
            ),
        ]
    if op == "SplitToSequence":
        return [
            Case(op, [F(4, 3)], {"axis": 0}, "keepdims", chain=_follow("ConcatFromSequence", attrs={"axis": 1})),
            Case(op, [F(4, 3), I([1, 3])], {"axis": 0}, "split_sizes", chain=_follow("SequenceAt", [I(1)])),
            Case(
                op,
                [F(4, 3)],
                {"axis": 1, "keepdims": 0},
                "no_keepdims",
                chain=_follow("ConcatFromSequence", attrs={"axis": 0, "new_axis": 1}),
            ),
        ]
    if op == "SequenceLength":
        return [Case("SequenceConstruct", [F(2, 3), F(2, 3), F(1, 3)], {}, "length", chain=_follow("SequenceLength"))]
    if op == "SequenceInsert":
        return [
            Case(
                "SequenceConstruct",
                [F(2, 3), F(2, 3)],
                {},
                "insert_at_0",
                chain=_follow("SequenceInsert", [F(1, 3), I(0)], then=("ConcatFromSequence", {"axis": 0})),
            )
        ]
    if op == "SequenceErase":
        return [
            Case(
                "SequenceConstruct",
                [F(2, 3), F(4, 3), F(1, 3)],
                {},
                "erase_1",
                chain=_follow("SequenceErase", [I(1)], then=("ConcatFromSequence", {"axis": 0})),
            )
        ]
    if op == "SequenceEmpty":
        return [
            Case(
                op,
                [],
                {"dtype": TensorProto.FLOAT},
                "empty_insert",
                chain=_follow("SequenceInsert", [F(2, 3)], then=("ConcatFromSequence", {"axis": 0})),
            )
        ]
    raise KeyError(op)


def _follow(op: str, extra: Optional[List[In]] = None, attrs: Optional[dict] = None, then=None) -> dict:
    """Nodes after the op under test that turn its sequence/optional output back into a tensor:
    `op(output, *extra)`, then optionally `then = (op2, attrs2)` on that result."""
    return {"op": op, "extra": list(extra or []), "attrs": dict(attrs or {}), "then": then}


def _body(nodes, inputs, outputs):
    from onnx import helper

    return helper.make_graph(
        nodes,
        "body",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, s) for n, t, s in outputs],
    )


def _control_flow(op: str, version: int) -> List[Case]:
    from onnx import helper

    FLOAT, INT64, BOOL = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
    if op == "If":  # branches read cap0 from the outer scope
        then_branch = _body([helper.make_node("Mul", ["cap0", "cap0"], ["t"])], [], [("t", FLOAT, [2, 3])])
        else_branch = _body([helper.make_node("Neg", ["cap0"], ["e"])], [], [("e", FLOAT, [2, 3])])
        attrs = {"then_branch": then_branch, "else_branch": else_branch}
        return [
            Case(op, [I(True, dtype="bool", role="data")], attrs, "then", captured=[F(2, 3)]),
            Case(op, [I(False, dtype="bool", role="data")], attrs, "else", captured=[F(2, 3)]),
        ]
    if op == "Loop":  # v <- v * cap0 + iteration, three trips; scan output: every v
        body = _body(
            [
                helper.make_node("Mul", ["v_in", "cap0"], ["m"]),
                helper.make_node("Cast", ["i"], ["fi"], to=FLOAT),
                helper.make_node("Add", ["m", "fi"], ["v_out"]),
                helper.make_node("Identity", ["c_in"], ["c_out"]),
                helper.make_node("Identity", ["v_out"], ["s_out"]),
            ],
            [("i", INT64, []), ("c_in", BOOL, []), ("v_in", FLOAT, [3])],
            [("c_out", BOOL, []), ("v_out", FLOAT, [3]), ("s_out", FLOAT, [3])],
        )
        return [
            Case(op, [I(3), I(True, dtype="bool"), F(3)], {"body": body}, "trip_count", outputs=2, captured=[F(3)]),
            Case(op, [I(4), NONE, F(3)], {"body": body}, "no_condition", outputs=2, captured=[F(3)]),
        ]
    if op == "Scan" and version >= 9:  # running sum over the rows; scan output: state * row
        body = _body(
            [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]), helper.make_node("Mul", ["s_in", "x_t"], ["y_t"])],
            [("s_in", FLOAT, [3]), ("x_t", FLOAT, [3])],
            [("s_out", FLOAT, [3]), ("y_t", FLOAT, [3])],
        )
        return [
            Case(op, [F(3), F(4, 3)], {"body": body, "num_scan_inputs": 1}, "rows", outputs=2),
            Case(
                op,
                [F(3), F(4, 3)],
                {"body": body, "num_scan_inputs": 1, "scan_input_directions": [1], "scan_output_directions": [1]},
                "reverse",
                outputs=2,
            ),
            Case(op, [F(3), F(3, 4)], {"body": body, "num_scan_inputs": 1, "scan_input_axes": [1]}, "axis1", outputs=2),
        ]
    if op == "Scan":  # Scan-8: a batch axis and sequence_lens first
        body = _body(
            [helper.make_node("Add", ["s_in", "x_t"], ["s_out"]), helper.make_node("Mul", ["s_in", "x_t"], ["y_t"])],
            [("s_in", FLOAT, [3]), ("x_t", FLOAT, [3])],
            [("s_out", FLOAT, [3]), ("y_t", FLOAT, [3])],
        )
        return [Case(op, [NONE, F(2, 3), F(2, 4, 3)], {"body": body, "num_scan_inputs": 1}, "batched", outputs=2)]
    if op == "SequenceMap":  # each row of a split, squared, concatenated back
        body = _body(
            [helper.make_node("Mul", ["row", "row"], ["squared"])],
            [("row", FLOAT, [1, 3])],
            [("squared", FLOAT, [1, 3])],
        )
        return [
            Case(
                "SplitToSequence",
                [F(4, 3)],
                {"axis": 0},
                "square_rows",
                chain=_follow("SequenceMap", attrs={"body": body}, then=("ConcatFromSequence", {"axis": 0})),
            )
        ]
    raise KeyError(op)


# op -> recipe(op, version)
RECIPES: Dict[str, Callable[[str, int], List[Case]]] = {}
for _op in _UNARY_RANGES:
    RECIPES[_op] = _unary
for _op in ("Elu", "Selu", "Celu", "LeakyRelu", "HardSigmoid", "ThresholdedRelu"):
    RECIPES[_op] = _activation_params
for _op in ("Softmax", "LogSoftmax", "Hardmax"):
    RECIPES[_op] = _softmax
for _op in ("Add", "Sub", "Mul", "Div", "Pow"):
    RECIPES[_op] = _binary
for _op in ("Max", "Min", "Mean", "Sum"):
    RECIPES[_op] = _variadic
for _op in ("Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual"):
    RECIPES[_op] = _compare
for _op in ("And", "Or", "Xor", "Not"):
    RECIPES[_op] = _logical
for _op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot", "BitShift"):
    RECIPES[_op] = _bitwise
for _op in (
    "ReduceMean",
    "ReduceSum",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceSumSquare",
):
    RECIPES[_op] = _reduce
for _op in ("ArgMax", "ArgMin"):
    RECIPES[_op] = _arg
for _op in ("RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Bernoulli", "Multinomial"):
    RECIPES[_op] = _random
for _op in ("HannWindow", "HammingWindow", "BlackmanWindow"):
    RECIPES[_op] = _window
for _op in (
    "SequenceConstruct",
    "SequenceAt",
    "ConcatFromSequence",
    "SplitToSequence",
    "SequenceLength",
    "SequenceInsert",
    "SequenceErase",
    "SequenceEmpty",
):
    RECIPES[_op] = _sequence_cases
for _op in ("If", "Loop", "Scan", "SequenceMap"):
    RECIPES[_op] = _control_flow
RECIPES.update(
    {
        "Mod": _mod,
        "PRelu": _prelu,
        "Where": _where,
        "Clip": _clip,
        "MatMul": _matmul,
        "Gemm": _gemm,
        "Einsum": _einsum,
        "Conv": _conv,
        "ConvTranspose": _conv_transpose,
        "MaxPool": _pool,
        "AveragePool": _pool,
        "LpPool": _lp_pool,
        "GlobalLpPool": _global_lp,
        "BatchNormalization": _batch_norm,
        "InstanceNormalization": _instance_norm,
        "LayerNormalization": _layer_norm,
        "GroupNormalization": _group_norm,
        "LRN": _lrn,
        "MeanVarianceNormalization": _mvn,
        "LpNormalization": _lp_norm,
        "Flatten": _flatten,
        "Reshape": _reshape,
        "Transpose": _transpose,
        "Squeeze": _squeeze,
        "Unsqueeze": _unsqueeze,
        "Concat": _concat,
        "Split": _split,
        "Slice": _slice,
        "Gather": _gather,
        "GatherElements": _gather_elements,
        "GatherND": _gather_nd,
        "ScatterElements": _scatter_elements,
        "Scatter": _scatter_elements,
        "ScatterND": _scatter_nd,
        "Pad": _pad,
        "Expand": _expand,
        "Tile": _tile,
        "DepthToSpace": _depth_to_space,
        "SpaceToDepth": _space_to_depth,
        "Resize": _resize,
        "Upsample": _upsample,
        "TopK": _topk,
        "Cast": _cast,
        "CastLike": _cast_like,
        "Shape": _shape,
        "Constant": _constant,
        "ConstantOfShape": _constant_of_shape,
        "Range": _range,
        "OneHot": _onehot,
        "Compress": _compress,
        "CumSum": _cumsum,
        "Trilu": _trilu,
        "EyeLike": _eye_like,
        "Det": _det,
        "ReverseSequence": _reverse_sequence,
        "Unique": _unique,
        "Shrink": _shrink,
        "Gelu": _gelu,
        "Dropout": _dropout,
        "SoftmaxCrossEntropyLoss": _nll,
        "NegativeLogLikelihoodLoss": _nll,
        "RNN": _rnn,
        "GRU": _rnn,
        "LSTM": _rnn,
        "RoiAlign": _roi,
        "MaxRoiPool": _roi,
        "GridSample": _grid_sample,
        "AffineGrid": _affine_grid,
        "Col2Im": _col2im,
        "CenterCropPad": _center_crop_pad,
        "MaxUnpool": _max_unpool,
        "NonMaxSuppression": _nms,
        "StringNormalizer": _string_normalizer,
        "TfIdfVectorizer": _tfidf,
        "RegexFullMatch": _regex,
        "StringConcat": _string_concat,
        "StringSplit": _string_split,
        "DequantizeLinear": _dequantize,
        "QuantizeLinear": _quantize,
        "DynamicQuantizeLinear": _dynamic_quantize,
        "QLinearMatMul": _qlinear_matmul,
        "MatMulInteger": _matmul_integer,
        "ConvInteger": _conv_integer,
        "QLinearConv": _qlinear_conv,
        "MelWeightMatrix": _mel,
        "DFT": _dft,
        "STFT": _stft,
        "OptionalGetElement": _optional,
        "OptionalHasElement": _optional,
        "Optional": _optional,
    }
)


def cases(op: str, version: int) -> List[Case]:
    """The cases for ai.onnx `op` at schema `version` (the default: one float (2,3,4) input)."""
    recipe = RECIPES.get(op)
    if recipe is None:
        return [Case(op, [F(*X)])]
    return recipe(op, version)


# ---- ORT-schema ops that ORT's transformers put into training and eval graphs -----------------

MS = "com.microsoft"


def _contrib() -> List[Case]:
    h = 4
    x = F(2, 3, h)
    out: List[Case] = [
        Case("Gelu", [F(*X)], domain=MS),
        Case("BiasGelu", [F(*X), F(4)], domain=MS),
        Case("FastGelu", [F(*X)], variant="no_bias", domain=MS),
        Case("FastGelu", [F(*X), F(4)], variant="bias", domain=MS),
        Case("QuickGelu", [F(*X)], variant="default_alpha", domain=MS),
        Case("QuickGelu", [F(*X)], {"alpha": 1.0}, "alpha1", domain=MS),
        Case("QuickGelu", [F(*X)], {"alpha": 1.5}, "alpha1.5", domain=MS),
        # ORT registers its own LayerNormalization / SimplifiedLayerNormalization schemas in the
        # ai.onnx domain (version 1): below opset 17 that is what LayerNormFusion writes.
        # ... with the statistics outputs declared as LayerNormFusion writes them (ORT's
        # gradient builder reads them: without, "i < node_->OutputDefs().size()").
        Case("LayerNormalization", [x, F(h), F(h)], {}, "opset16", outputs=3, graph_outputs=[0], opset=16),
        Case(
            "LayerNormalization",
            [x, F(h)],
            {"epsilon": 1e-3},
            "opset14_no_bias",
            outputs=3,
            graph_outputs=[0],
            opset=14,
        ),
        Case(
            "LayerNormalization",
            [x, F(3, h), F(3, h)],
            {"axis": 1},
            "opset16_axis1",
            outputs=3,
            graph_outputs=[0],
            opset=16,
        ),
        Case("LayerNormalization", [x, F(h), F(h)], {}, "opset16_with_stats", outputs=3, opset=16),
        Case("SimplifiedLayerNormalization", [x, F(h)], {}, "opset17", outputs=2, graph_outputs=[0], opset=17),
        Case(
            "SimplifiedLayerNormalization",
            [x, F(h)],
            {"epsilon": 1e-3},
            "opset14",
            outputs=2,
            graph_outputs=[0],
            opset=14,
        ),
        Case(
            "SimplifiedLayerNormalization", [x, F(3, h)], {"axis": 1}, "axis1", outputs=2, graph_outputs=[0], opset=17
        ),
        Case("SkipLayerNormalization", [x, F(2, 3, h), F(h), F(h)], {}, "with_beta", domain=MS),
        Case("SkipLayerNormalization", [x, F(2, 3, h), F(h), F(h), F(h)], {"epsilon": 1e-3}, "with_bias", domain=MS),
        Case("SkipLayerNormalization", [x, F(2, 3, h), F(h)], {}, "no_beta", domain=MS),
        Case("SkipSimplifiedLayerNormalization", [x, F(2, 3, h), F(h)], {}, "default", domain=MS),
        Case("SkipSimplifiedLayerNormalization", [x, F(2, 3, h), F(h), F(h)], {}, "with_bias", domain=MS),
        Case("FusedMatMul", [F(2, 3, 4), F(4, 5)], {}, "plain", domain=MS),
        Case("FusedMatMul", [F(2, 4, 3), F(5, 4)], {"transA": 1, "transB": 1, "alpha": 0.5}, "trans_alpha", domain=MS),
        Case("FusedMatMul", [F(3, 2, 4), F(4, 5)], {"transBatchA": 1}, "trans_batch_a", domain=MS),
        Case("FusedConv", [F(2, 4, 5, 5), F(3, 4, 3, 3), F(3)], {"activation": "Relu"}, "relu", domain=MS),
        Case(
            "FusedConv",
            [F(2, 4, 5, 5), F(3, 4, 3, 3)],
            {"activation": "LeakyRelu", "activation_params": [0.1], "pads": [1, 1, 1, 1]},
            "leaky_relu",
            domain=MS,
        ),
        Case(
            "FusedConv",
            [F(2, 4, 5, 5), F(3, 4, 3, 3), F(3), F(2, 3, 3, 3)],
            {"activation": "Relu"},
            "relu_sum",
            domain=MS,
        ),
        Case("FusedGemm", [F(3, 4), F(4, 5), F(5)], {"activation": "Relu"}, "relu", domain=MS),
        Case(
            "FusedGemm",
            [F(3, 4), F(5, 4), F(5)],
            {"activation": "LeakyRelu", "activation_alpha": 0.2, "transB": 1},
            "leaky_relu",
            domain=MS,
        ),
        Case("BiasSoftmax", [F(2, 3, 4), F(2, 3, 4)], {"axis": -1, "is_inner_broadcast": 0}, "default", domain=MS),
        Case("BiasSoftmax", [F(2, 3, 4), F(1, 3, 4)], {"axis": -1, "is_inner_broadcast": 0}, "broadcast", domain=MS),
        Case("BiasDropout", [F(2, 3, 4), F(4), F(2, 3, 4), Fv(0.3)], {}, "no_training_mode", domain=MS),
        Case(
            "BiasDropout",
            [F(2, 3, 4), F(4), F(2, 3, 4), Fv(0.3), I(True, dtype="bool")],
            {},
            "training",
            domain=MS,
            stochastic=True,
        ),
        Case("ConcatTraining", [F(2, 3), F(2, 2)], {"axis": 1}, "axis1", outputs=2, graph_outputs=[0], domain=MS),
        Case("ConcatTraining", [F(2, 3), F(2, 2)], {"axis": 1}, "with_lengths", outputs=2, domain=MS),
        Case(
            "BatchNormInternal",
            [F(4, 3, 2, 2), F(3), F(3), F(3, role="const"), P(3, role="const")],
            {"epsilon": 1e-5, "momentum": 0.9, "training_mode": 1},
            "training",
            outputs=5,
            graph_outputs=[0],
            domain=MS,
        ),
        Case(
            "SoftmaxCrossEntropyLossInternal",
            [F(3, 5), I([1, 4, 0])],
            {"reduction": "mean"},
            "mean",
            outputs=2,
            domain=MS,
        ),
        Case(
            "SoftmaxCrossEntropyLossInternal",
            [F(3, 5), I([1, 4, 2]), P(5, role="const"), I(2)],
            {"reduction": "sum"},
            "weighted_ignore",
            outputs=2,
            domain=MS,
        ),
        # ... outputs beyond Y, Y_h(, Y_c) hold what LSTMGrad/GRUGrad read (all states, gate values)
        Case(
            "LSTMTraining",
            [F(3, 2, 4), F(1, 20, 4), F(1, 20, 5), F(1, 40)],
            {"hidden_size": 5},
            "forward",
            outputs=6,
            graph_outputs=[0, 1, 2],
            domain=MS,
        ),
        Case(
            "GRUTraining",
            [F(3, 2, 4), F(1, 15, 4), F(1, 15, 5), F(1, 30)],
            {"hidden_size": 5},
            "forward",
            outputs=3,
            graph_outputs=[0, 1],
            domain=MS,
        ),
        Case("ScaledSum", [F(*X), F(*X)], {"scale_0": 0.5, "scale_1": 2.0}, "two", domain=MS),
        Case("ScaledSum", [F(*X), F(*X), F(*X)], {"scale_0": 0.5, "scale_1": 2.0, "scale_2": -1.0}, "three", domain=MS),
        Case("Scale", [F(*X), Fv([2.5])], {}, "multiply", domain=MS),
        Case("Scale", [F(*X), Fv([2.0])], {"scale_down": 1}, "divide", domain=MS),
        Case(
            "FakeQuant", [F(*X), Fv(0.1), Fv(128.0)], {"quant_min": 0, "quant_max": 255}, "uint8", outputs=2, domain=MS
        ),
        # what IsInfReduceSumFusion writes (mixed-precision loss scaling), and the CUDA dropouts
        Case("IsAllFinite", [F(*X), F(3)], {}, "default", domain=MS),
        Case("BitmaskDropout", [F(*X), Fv(0.3)], {}, "no_training_mode", outputs=2, domain=MS),
        Case("BitmaskBiasDropout", [F(*X), F(4), F(*X), Fv(0.3)], {}, "no_training_mode", outputs=2, domain=MS),
    ]
    return out


CONTRIB_CASES: List[Case] = _contrib()
