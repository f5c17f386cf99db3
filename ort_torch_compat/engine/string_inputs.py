"""String graph inputs: fed as the numbers their Cast nodes make of them.

torch has no string tensors, while ORT accepts string inputs (text features, string labels)
that the graph turns into numbers with `Cast`.  We take those Cast nodes out of the graph
and run them on the host when a step is fed, parsing each string the way ORT's Cast kernel
does (measured: `std::stod` for floating-point targets, `std::stoll` for signed integers,
`std::stoull` for unsigned integers and bool: leading C whitespace skipped, the longest
valid prefix parsed, hexadecimal floats, inf and nan accepted, out-of-range values
refused, integers wrapped to narrower types).  A string input that feeds anything other
than a numeric Cast is refused when the Module is created, naming the input.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import TYPE_CHECKING, Dict, List, Sequence, Tuple

import numpy as np
import torch

from ..codec.dtypes import numpy_dtype, torch_dtype
from ..errors import InvalidInputError, ModelLoadError
from .io_spec import ONNX_TYPE_NAMES, STRING, ValueSpec

if TYPE_CHECKING:
    import onnx

_WHITESPACE = " \t\n\v\f\r"  # C's isspace() in the "C" locale
_FLOAT_PREFIX = re.compile(
    r"""[+-]?(?:
        0x(?:[0-9a-f]+(?:\.[0-9a-f]*)?|\.[0-9a-f]+)(?:p[+-]?[0-9]+)?
      | (?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:e[+-]?[0-9]+)?
      | inf(?:inity)?
      | nan(?:\([0-9a-z_]*\))?
    )""",
    re.X | re.I | re.A,
)
_INT_PREFIX = re.compile(r"([+-]?)([0-9]+)", re.A)
# TensorProto codes (onnx is not imported with the package): FLOAT 1, DOUBLE 11, FLOAT16 10;
# INT8 3, INT16 5, INT32 6, INT64 7; UINT8 2, UINT16 4, UINT32 12, UINT64 13, BOOL 9.
_FLOAT16, _BOOL = 10, 9
_FLOAT_TARGETS = {1, 11, _FLOAT16}
_SIGNED_TARGETS = {3, 5, 6, 7}
_UNSIGNED_TARGETS = {2, 4, 12, 13, _BOOL}
_INT64 = 2**63
_UINT64 = 2**64


def _text(item: object) -> str:
    return item.decode("utf-8", "surrogateescape") if isinstance(item, bytes) else str(item)


def _exact_hex(text: str) -> Fraction:
    """The exact value of a C hexadecimal float literal (to tell exact subnormals from underflow)."""
    body = text.lstrip("+-")[2:].lower()
    mantissa, _, exponent = body.partition("p")
    whole, _, fraction = mantissa.partition(".")
    digits = int((whole + fraction) or "0", 16)
    value = Fraction(digits, 16 ** len(fraction)) * Fraction(2) ** int(exponent or "0")
    return -value if text.startswith("-") else value


def parse_double(item: object) -> float:
    """`std::stod`: ValueError where it throws (no number, or the value is out of double's range)."""
    text = _text(item).lstrip(_WHITESPACE)
    match = _FLOAT_PREFIX.match(text)
    if match is None:
        raise ValueError("no number at the start (std::stod: invalid_argument)")
    literal = match.group(0)
    bare = literal.lstrip("+-").lower()
    if bare.startswith(("inf", "nan")):
        return float(literal.split("(")[0])
    try:
        value = float.fromhex(literal) if bare.startswith("0x") else float(literal)
    except OverflowError:
        value = float("inf")
    if value in (float("inf"), float("-inf")):
        raise ValueError("out of the range of double (std::stod: out_of_range)")
    if abs(value) < 2.2250738585072014e-308:  # zero or subnormal: strtod reports an inexact underflow
        exact = _exact_hex(literal) if bare.startswith("0x") else Fraction(literal)
        if exact != Fraction(value):
            raise ValueError("below the range of double (std::stod: out_of_range)")
    return value


def parse_integer(item: object, unsigned: bool) -> int:
    """`std::stoll` (or `std::stoull` when `unsigned`, which wraps negative numbers modulo 2**64)."""
    match = _INT_PREFIX.match(_text(item).lstrip(_WHITESPACE))
    function = "std::stoull" if unsigned else "std::stoll"
    if match is None:
        raise ValueError(f"no integer at the start ({function}: invalid_argument)")
    sign, digits = match.groups()
    magnitude = int(digits)
    if unsigned:
        if magnitude >= _UINT64:
            raise ValueError(f"out of the range of uint64 ({function}: out_of_range)")
        return (-magnitude) % _UINT64 if sign == "-" else magnitude
    value = -magnitude if sign == "-" else magnitude
    if not -_INT64 <= value < _INT64:
        raise ValueError(f"out of the range of int64 ({function}: out_of_range)")
    return value


def cast_strings(array: np.ndarray, to: int) -> np.ndarray:
    """ORT's Cast of a string tensor to the numeric type `to` (a TensorProto code).

    Raises ValueError naming the first string that does not convert.
    """
    items = array.reshape(-1).tolist()
    parsed = []
    for item in items:
        try:
            if to in _FLOAT_TARGETS:
                parsed.append(parse_double(item))
            else:
                parsed.append(parse_integer(item, unsigned=to in _UNSIGNED_TARGETS))
        except ValueError as error:
            raise ValueError(f"cannot convert {_text(item)!r} to {ONNX_TYPE_NAMES[to].upper()}: {error}") from None
    target = numpy_dtype(to)
    with np.errstate(over="ignore", invalid="ignore"):
        if to in _FLOAT_TARGETS:
            wide = np.array(parsed, dtype=np.float64)
            values = wide.astype(np.float32).astype(target) if to == _FLOAT16 else wide.astype(target)
        elif to == _BOOL:
            values = np.array([value != 0 for value in parsed], dtype=np.bool_)
        else:  # C++ integer conversion: wrap modulo 2**bits
            bits = np.dtype(target).itemsize * 8
            signed = to in _SIGNED_TARGETS
            values = np.array([_wrap(value, bits, signed) for value in parsed], dtype=target)
    return values.reshape(array.shape)


def _wrap(value: int, bits: int, signed: bool) -> int:
    value %= 2**bits
    return value - 2**bits if signed and value >= 2 ** (bits - 1) else value


class StringCasts:
    """Which user inputs are strings, and the Cast outputs fed in their place.

    `model` is the model without those Cast nodes (the given one when there are no string
    inputs), and `fed_names` the graph inputs its torch module takes instead of the user
    inputs: each string input is replaced by the outputs of the Cast nodes that read it
    (`fed_from` names the user input behind each).
    """

    def __init__(self, model: "onnx.ModelProto", user_inputs: Sequence[ValueSpec], label: str):
        import onnx  # loaded with the model already

        self._plan: Dict[int, List[Tuple[str, int]]] = {}
        graph_outputs = {out.name for out in model.graph.output}
        removed = []
        for position, spec in enumerate(user_inputs):
            if spec.elem_type != STRING:
                continue
            readers = [node for node in model.graph.node if spec.name in node.input]
            others = sorted(
                {
                    f"{node.domain or 'ai.onnx'}::{node.op_type}"
                    for node in readers
                    if node.op_type != "Cast" or node.domain not in ("", "ai.onnx")
                }
            )
            if others or spec.name in graph_outputs:
                used_by = others + (["a graph output"] if spec.name in graph_outputs else [])
                raise ModelLoadError(
                    f"{label}: string input '{spec.name}' is read by {', '.join(used_by)}; torch has no string "
                    "tensors, so string inputs are supported only when Cast nodes turn them into numbers"
                )
            casts = []
            for node in readers:
                to = onnx.helper.get_attribute_value(next(a for a in node.attribute if a.name == "to"))
                if to not in _FLOAT_TARGETS | _SIGNED_TARGETS | _UNSIGNED_TARGETS:
                    raise ModelLoadError(
                        f"{label}: string input '{spec.name}' is cast to {onnx.TensorProto.DataType.Name(to)}, "
                        "which ORT's Cast does not parse from strings either"
                    )
                torch_dtype(to)  # ValueError now, not at the first step, if this torch lacks the type
                casts.append((node.output[0], to))
                removed.append(node)
            self._plan[position] = casts
        self.model = model
        if removed:  # a copy without the Cast nodes: the caller's ModelProto stays as it was
            self.model = onnx.ModelProto()
            self.model.CopyFrom(model)
            kept = [node for node in model.graph.node if node not in removed]
            del self.model.graph.node[:]
            self.model.graph.node.extend(kept)
        fed = [
            (name, spec.name)
            for position, spec in enumerate(user_inputs)
            for name in ([out for out, _ in self._plan[position]] if position in self._plan else [spec.name])
        ]
        self.fed_names = [name for name, _ in fed]
        self.fed_from = [source for _, source in fed]  # the user input each fed value comes from
        self._names = [spec.name for spec in user_inputs]

    def __bool__(self) -> bool:
        return bool(self._plan)

    def feeds(self, inputs: Sequence, step: str) -> List[torch.Tensor]:
        """The tensors to feed the module: string inputs replaced by their parsed Cast outputs."""
        if not self._plan:
            return list(inputs)
        feeds: List[torch.Tensor] = []
        for position, value in enumerate(inputs):
            if position not in self._plan:
                feeds.append(value)
                continue
            for _, to in self._plan[position]:
                try:
                    feeds.append(torch.from_numpy(cast_strings(value, to)))
                except ValueError as error:
                    raise InvalidInputError(f"{step}: input '{self._names[position]}': {error}") from None
        return feeds
