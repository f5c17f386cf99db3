"""Whether a traced step runs oneDNN's kernels or ATen's own: its oneDNN calls timed both ways.

Why: ATen sends some float32 CPU operators to oneDNN (GELU and its backward, convolutions),
which pays 7-11 us a call before any work: on the tiny transformers ATen's own GELU is 4-6x
faster, on large tensors and depthwise convolutions oneDNN is (traced_step.py's docstring).
Timing the whole step both ways decided it before, but on a step of ~1 ms the difference
(BERT-tiny's two GELUs and their backward: ~0.09 ms) is of the size of the timing noise at
the 10% margin: BERT-tiny's traced step ran oneDNN's GELU in 1 build of 6 on the AMD host,
15% of its step time.

How: the graph's calls to those operators alone are run on random tensors of their shapes,
dtypes and strides, with oneDNN on and off in alternating rounds, several passes a round;
the least time of each way counts (other processes only add time).  A few milliseconds on the
tiny models; a pass of a convolutional model's calls is timed once a round.
"""

from __future__ import annotations

import time
from typing import List, Optional, Tuple

import torch
from torch import fx

# the operators ATen sends to oneDNN on float32 CPU tensors (ATen's use_mkldnn checks)
ONEDNN_OPERATORS = {"gelu", "gelu_backward", "convolution", "convolution_backward"}
_ROUNDS = 5
_ROUND_S = 0.002  # passes a round: as many as take about this long (at least one)
_MAX_PASSES = 50

Call = Tuple[object, tuple, dict]


def _example(value: object) -> object:
    """A real tensor like the fake one a graph node records, or the value itself."""
    if isinstance(value, (list, tuple)):
        return type(value)(_example(v) for v in value)
    if isinstance(value, fx.Node):
        fake = value.meta.get("val")
        if not isinstance(fake, torch.Tensor):
            raise LookupError(f"no tensor recorded for {value.name}")
        tensor = torch.empty_strided(tuple(fake.shape), tuple(fake.stride()), dtype=fake.dtype)
        return tensor.uniform_(-1.0, 1.0) if tensor.is_floating_point() else tensor.zero_()
    return value


def onednn_calls(graph: fx.GraphModule) -> Optional[List[Call]]:
    """`graph`'s calls to the operators ATen sends to oneDNN, on random tensors of the
    recorded shapes; None where a call's arguments were not recorded."""
    calls = []
    for node in graph.graph.nodes:
        name = getattr(node.target, "__name__", "").split(".")[0]
        if node.op == "call_function" and name in ONEDNN_OPERATORS:
            try:
                calls.append((node.target, _example(node.args), _example(dict(node.kwargs))))
            except LookupError:
                return None
    return calls


def _pass_s(calls: List[Call], passes: int) -> float:
    began = time.perf_counter()
    for _ in range(passes):
        for operator, args, kwargs in calls:
            operator(*args, **kwargs)
    return (time.perf_counter() - began) / passes


def atens_share(calls: List[Call]) -> float:
    """The time `calls` take with ATen's own kernels as a share of their time with
    oneDNN's (least of `_ROUNDS` alternating rounds each); oneDNN's setting is the caller's
    again on return."""
    enabled = torch._C._get_mkldnn_enabled()
    best = {True: float("inf"), False: float("inf")}
    try:
        with torch.no_grad():
            for onednn in (True, False):  # first calls: oneDNN's kernel creation, caches
                torch._C._set_mkldnn_enabled(onednn)
                _pass_s(calls, 1)
            one = _pass_s(calls, 1)
            passes = max(1, min(_MAX_PASSES, int(_ROUND_S / max(one, 1e-9))))
            for index in range(_ROUNDS):
                for onednn in (True, False) if index % 2 == 0 else (False, True):
                    torch._C._set_mkldnn_enabled(onednn)
                    best[onednn] = min(best[onednn], _pass_s(calls, passes))
    finally:
        torch._C._set_mkldnn_enabled(enabled)
    return best[False] / best[True]
