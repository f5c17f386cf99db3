"""The traced step's choice between oneDNN's kernels and ATen's own (engine/onednn_choice.py):
which calls are timed, on what tensors, both ways, and oneDNN's setting left as it was."""

from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ort_torch_compat.engine import onednn_choice


def _gelu_step(x, w):
    """A dense layer, GELU and its backward (the calls of a transformer's feed-forward)."""
    h = x @ w.t()
    y = torch.ops.aten.gelu(h)
    return y, torch.ops.aten.gelu_backward(torch.ones_like(y), h)


def _graph():
    return make_fx(_gelu_step)(torch.randn(2, 8, 16), torch.randn(64, 16))


def test_the_gelu_calls_are_taken_with_tensors_of_their_shapes():
    calls = onednn_choice.onednn_calls(_graph())
    assert [str(operator) for operator, _, _ in calls] == ["aten.gelu.default", "aten.gelu_backward.default"]
    for operator, args, kwargs in calls:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        assert tensors and all(t.shape == (2, 8, 64) and t.dtype == torch.float32 for t in tensors)
        assert all(t.abs().max() <= 1 for t in tensors)  # random, not uninitialised memory
        operator(*args, **kwargs)


def test_a_graph_without_them_has_no_calls_and_one_without_records_is_not_timed():
    graph = make_fx(lambda x: (x * 2).sum())(torch.randn(3))
    assert onednn_choice.onednn_calls(graph) == []
    graph = _graph()
    for node in graph.graph.nodes:
        node.meta.pop("val", None)
    assert onednn_choice.onednn_calls(graph) is None


@pytest.mark.parametrize("enabled", [True, False])
def test_both_ways_timed_and_the_least_of_each_compared(enabled, monkeypatch):
    """Rounds alternate oneDNN on and off; the share is ATen's least over oneDNN's least; the
    caller's setting holds afterwards."""
    seen = []
    # the first of each: the warm-up (then ATen's estimate), fast here and not counted
    times = {True: iter([0.1, 3.0, 4.0, 6.0, 9.0, 4.0]), False: iter([0.01, 0.02, 1.5, 0.5, 2.5, 1.0, 3.0])}

    def timed(calls, passes):
        onednn = torch._C._get_mkldnn_enabled()
        seen.append(onednn)
        return next(times[onednn])

    monkeypatch.setattr(onednn_choice, "_pass_s", timed)
    with torch.backends.mkldnn.flags(enabled=enabled):
        share = onednn_choice.atens_share(onednn_choice.onednn_calls(_graph()))
        assert torch._C._get_mkldnn_enabled() is enabled
    # warm-up both ways, the estimate, then 5 alternating rounds
    assert seen[:3] == [True, False, False]
    assert seen[3:] == [True, False, False, True, True, False, False, True, True, False]
    assert share == pytest.approx(0.5 / 3.0)  # least of the rounds: ATen 0.5, oneDNN 3.0


def test_onednn_setting_restored_after_a_call_that_raised(monkeypatch):
    def failing(*args, **kwargs):
        raise RuntimeError("kernel failed (test)")

    calls = [(failing, (), {})]
    with torch.backends.mkldnn.flags(enabled=True):
        with pytest.raises(RuntimeError, match="kernel failed"):
            onednn_choice.atens_share(calls)
        assert torch._C._get_mkldnn_enabled()


def test_real_calls_give_a_finite_share():
    share = onednn_choice.atens_share(onednn_choice.onednn_calls(_graph()))
    assert 0 < share < float("inf")
