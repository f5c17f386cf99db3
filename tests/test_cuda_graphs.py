"""Train and optimizer steps replayed as CUDA graphs (engine/cuda_graphs.py, optimizer_graphs.py).

Two halves:
- everywhere: the graphs' bookkeeping (static feeds, overwrite/accumulate variants, the flat
  gradient buffers bound as `.grad`, per-step scalars, outputs copied out of the graph,
  fallback when capture fails) through a recorder that re-runs what it captured on the CPU,
  against the same steps run eagerly;
- on a GPU: the real capture and replay, against eager CUDA steps and against the CPU.
Both run the same scenario: lazy_reset_grad, an accumulating step, learning-rate changes,
a checkpoint saved and reloaded between replays, a second batch size, per-step gradients.
"""

from __future__ import annotations

import logging

import numpy as np
import onnx
import onnx.helper as h
import pytest
import torch

import ort_torch_compat.api as ours
from ort_torch_compat import artifacts, onnxblock
from ort_torch_compat.capi_session import set_seed
from ort_torch_compat.engine import cuda_graphs
from ort_torch_compat.engine.cuda_graphs import TrainStepGraphs
from ort_torch_compat.testing.parity_rule import ADAMW_PARAM_ATOL, ATOL, RTOL
from ort_torch_compat.testing.scenario import make_batch
from tests.conftest import FIXTURES, load_spec

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device")
CONFIGS = [
    "mlp_ce_adamw_op17",
    "mlp_mse_adamw_mode0_wd_op17",
    "mlp_mse_adamw_nobias_op17",
    "cnn_mse_sgd_op17",
    "cnn_ce_adamw_op17",
    "transformer_ce_adamw_op17",
    "gru_mse_adamw_op17",
    "lstm_ce_adamw_op17",
    "frozen_ce_adamw_op17",
]


# ---- a recorder that runs on the CPU -----------------------------------------------------------
class _RerunRecorder:
    """Capture runs the body (standing for capture + the first replay, which together run it
    once); each later replay runs it again and copies its results into the captured ones."""

    def __init__(self, fail: bool):
        self.fail, self.body, self.result, self.pending = fail, None, None, False

    def capture(self, body):
        if self.fail:
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing")
        self.body, self.result, self.pending = body, body(), True
        return self.result

    def replay(self):
        if self.pending:
            self.pending = False
            return
        fresh = self.body()
        if fresh is None:
            return
        for mine, new in zip(_flatten(self.result), _flatten(fresh)):
            if mine is not None:
                mine.copy_(new)


def _flatten(result):
    outputs, grads = result
    return [*outputs, *grads]


class _Staging:
    def __init__(self, tensor):
        self.tensor = tensor

    def send(self, values):
        self.tensor.copy_(torch.tensor(np.array(values, dtype=np.float32)))


class RerunStreams:
    """DeviceStream's interface on the CPU; `fail`: every capture raises as CUDA's would."""

    def __init__(self, fail: bool = False):
        self.fail = fail
        self.captures = 0

    def recorder(self):
        self.captures += 1
        return _RerunRecorder(self.fail)

    def staging(self, tensor):
        return _Staging(tensor)

    def run(self, body):
        return body()


def _graphed(module, streams):
    """`module` (and the Optimizer made after this) with its steps through `streams`."""
    engine = module._engine
    engine.graph_streams = streams
    engine._graphs = TrainStepGraphs(
        engine.train_module, engine.train_runner.eager, engine._train_params, engine.store, engine.train_label, streams
    )
    return module


# ---- the scenario ----------------------------------------------------------------------------
def _batches(spec, k):
    batch = make_batch(spec, k, 1)
    return [batch[i["name"]] for i in spec["inputs"]]


def run_scenario(directory, device, streams=None, tmp_path=None, session_options=None):
    """10 steps: overwrite steps, three accumulating two calls, lr changes, a checkpoint saved
    and loaded mid-run, per-step gradients at step 9.  Returns losses, per-step gradients and final parameters."""
    spec = load_spec(directory)
    state = ours.CheckpointState.load_checkpoint(directory / "checkpoint")
    module = ours.Module(directory / "training_model.onnx", state, device=device, session_options=session_options)
    if streams is not None:
        _graphed(module, streams)
    optimizer = ours.Optimizer(directory / "optimizer_model.onnx", module)
    optimizer.set_learning_rate(float(spec["lr"]))
    record = {}
    kept = []
    for k in range(1, 11):
        inputs = _batches(spec, k)
        if k == 9:
            outputs, grads = module._engine.train_step_with_gradients([torch.from_numpy(x) for x in inputs])
            loss = outputs[0]
            record.update({f"grad9/{n}": g.cpu().numpy() for n, g in grads.items()})
        else:
            loss = module(*inputs)
        kept.append(loss)
        if k in (3, 6, 8):  # accumulating two calls: run once, captured, replayed
            loss = module(*_batches(spec, 10 * k))
        if k == 4:
            optimizer.set_learning_rate(float(spec["lr"]) * 0.5)
        optimizer.step()
        module.lazy_reset_grad()
        if k == 5 and tmp_path is not None:  # saved between replays, and training goes on
            ours.CheckpointState.save_checkpoint(state, str(tmp_path / f"ckpt_{device}"), include_optimizer_state=True)
            reloaded = ours.CheckpointState.load_checkpoint(str(tmp_path / f"ckpt_{device}"))
            for name, param in state.parameters:
                np.testing.assert_array_equal(reloaded.parameters[name].data, param.data)
        record[f"loss{k}"] = np.asarray(loss.cpu() if isinstance(loss, torch.Tensor) else loss)
    # outputs returned earlier are not overwritten by later replays
    record["kept"] = np.array([float(np.asarray(x.cpu() if isinstance(x, torch.Tensor) else x)) for x in kept])
    for name, param in state.parameters:
        record[f"param/{name}"] = param.data
    record["lr"] = np.float32(optimizer.get_learning_rate())
    return record


def _assert_close(a, b, rtol, atol):
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_allclose(a[key], b[key], rtol=rtol, atol=atol, err_msg=key)


def _assert_parity(ours_, reference):
    """The parity suite's tolerances (parity_rule.py), parameters after AdamW updates looser."""
    assert ours_.keys() == reference.keys()
    for key in reference:
        atol = ADAMW_PARAM_ATOL if key.startswith("param/") else ATOL
        np.testing.assert_allclose(ours_[key], reference[key], rtol=RTOL, atol=atol, err_msg=key)


# ---- everywhere: the bookkeeping ----------------------------------------------------------------
@pytest.mark.parametrize("config", CONFIGS)
def test_graph_steps_match_eager_steps(config, tmp_path):
    """The graphed steps (re-run on the CPU) equal the eager ones within the parity
    tolerance (the optimizer graph's term-by-term formula and the eager fused kernel round
    differently; a lost accumulation or a stale learning rate moves parameters by ~lr)."""
    directory = FIXTURES / config
    streams = RerunStreams()
    graphed = run_scenario(directory, "cpu", streams, tmp_path)
    eager = run_scenario(directory, "cpu", None, tmp_path)
    _assert_parity(graphed, eager)
    assert streams.captures == 3  # overwrite, accumulate; the optimizer


def test_failed_capture_runs_eagerly_and_says_so_once(tmp_path, caplog):
    directory = FIXTURES / "mlp_ce_adamw_op17"
    cuda_graphs._reported.clear()
    with caplog.at_level(logging.WARNING, logger="ort_torch_compat.cuda_graphs"):
        graphed = run_scenario(directory, "cpu", RerunStreams(fail=True), tmp_path)
    eager = run_scenario(directory, "cpu", None, tmp_path)
    _assert_parity(graphed, eager)
    messages = [r.getMessage() for r in caplog.records if "capture failed" in r.getMessage()]
    assert len(messages) == 2, messages  # the train step's, the optimizer's: once each
    assert "operation not permitted when stream is capturing" in messages[0]


def test_refusal_reasons_name_the_code_that_failed():
    # A refusal names the innermost frame of the library's (or onnx2torch's) code, so the log
    # of a step that runs eagerly points at the converter to fix; an error raised elsewhere
    # gives the message alone.
    from ort_torch_compat.engine.device import parse_device

    with pytest.raises(Exception) as raised:
        parse_device("tpu:0")
    reason = cuda_graphs.refusal_reason("not specialized", raised.value)
    assert reason.startswith("not specialized (InvalidArgumentError: Unsupported device type: tpu.")
    assert reason.endswith(" in parse_device") and " at ort_torch_compat/engine/device.py:" in reason
    try:
        raise RuntimeError("first line\nsecond line")
    except RuntimeError as error:
        assert cuda_graphs.refusal_reason("capture failed", error) == "capture failed (RuntimeError: first line)"


def test_outputs_are_copies_and_gradients_persistent():
    """A returned loss keeps its value after later replays; `.grad` is the same flat
    gradient view across replays (what the optimizer graph reads)."""
    directory = FIXTURES / "mlp_ce_adamw_op17"
    spec = load_spec(directory)
    state = ours.CheckpointState.load_checkpoint(directory / "checkpoint")
    module = _graphed(ours.Module(directory / "training_model.onnx", state), RerunStreams())
    losses, grads = [], []
    for k in range(1, 5):
        losses.append((module(*_batches(spec, k)), float(module(*_batches(spec, k)))))
        grads.append([t.grad for t in module._engine.store.trainable])
        module.lazy_reset_grad()
    assert all(float(loss) == value for loss, value in losses)  # the same batch twice: accumulation
    assert all(a is b for a, b in zip(grads[1], grads[3]))
    assert module._engine.store.grads_bound


def test_graph_setting(monkeypatch):
    monkeypatch.delenv(cuda_graphs.GRAPHS_ENV, raising=False)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert cuda_graphs.graphs_enabled(cuda) and not cuda_graphs.graphs_enabled(cpu)
    monkeypatch.setenv(cuda_graphs.GRAPHS_ENV, "0")
    assert not cuda_graphs.graphs_enabled(cuda)

    class Options:
        def __init__(self, value):
            self.value = value

        def get_session_config_entry(self, key):
            assert key == cuda_graphs.CONFIG_KEY
            return self.value

    assert cuda_graphs.graphs_enabled(cuda, Options("1"))  # the config entry wins over the variable
    with pytest.raises(ValueError, match="cuda_graphs"):
        cuda_graphs.graphs_enabled(cuda, Options("maybe"))


# ---- on a GPU: real capture ---------------------------------------------------------------------
class _NoGraphs:
    def get_session_config_entry(self, key):
        if key == cuda_graphs.CONFIG_KEY:
            return "0"
        raise KeyError(key)


@needs_cuda
@pytest.mark.parametrize("config", CONFIGS)
def test_cuda_graphs_match_eager_cuda_and_cpu(config, tmp_path):
    directory = FIXTURES / config
    graphed = run_scenario(directory, "cuda", None, tmp_path)
    engine_eager = run_scenario(directory, "cuda", None, tmp_path, session_options=_NoGraphs())
    cpu = run_scenario(directory, "cpu", None, tmp_path)
    _assert_parity(graphed, engine_eager)
    _assert_parity(graphed, cpu)


@needs_cuda
def test_cuda_graphs_are_used():
    directory = FIXTURES / "transformer_ce_adamw_op17"
    spec = load_spec(directory)
    state = ours.CheckpointState.load_checkpoint(directory / "checkpoint")
    module = ours.Module(directory / "training_model.onnx", state, device="cuda")
    optimizer = ours.Optimizer(directory / "optimizer_model.onnx", module)
    for k in range(1, 4):
        module(*_batches(spec, k))
        optimizer.step()
        module.lazy_reset_grad()
    graphs = module._engine._graphs
    assert [entry is not None and bool(entry.recorders) for entry in graphs._signatures.values()] == [True]
    assert optimizer._optimizer._graph._recorder is not None


def _dropout_artifacts(directory):
    """A model with Dropout (ratio 0.3) made by our generator."""
    rng = np.random.default_rng(0)
    w = onnx.numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "W")
    graph = h.make_graph(
        [
            h.make_node("MatMul", ["x", "W"], ["h"]),
            h.make_node("Dropout", ["h", "ratio"], ["y"]),
        ],
        "dropout",
        [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, 8])],
        [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4, 16])],
        [w, onnx.numpy_helper.from_array(np.array(0.3, dtype=np.float32), "ratio")],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    artifacts.generate_artifacts(
        model,
        requires_grad=["W"],
        loss=artifacts.LossType.MSELoss,
        optimizer=onnxblock.optim.AdamW(),
        artifact_directory=directory,
    )


@needs_cuda
def test_dropout_draws_the_eager_numbers_per_seed(tmp_path):
    _dropout_artifacts(tmp_path)
    x = np.random.default_rng(1).standard_normal((4, 8)).astype(np.float32)
    target = np.zeros((4, 16), dtype=np.float32)
    runs = []
    for options in (None, _NoGraphs()):
        set_seed(7)
        state = ours.CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
        module = ours.Module(str(tmp_path / "training_model.onnx"), state, device="cuda", session_options=options)
        optimizer = ours.Optimizer(str(tmp_path / "optimizer_model.onnx"), module)
        losses = []
        for _ in range(6):
            losses.append(float(module(x, target)))
            optimizer.step()
            module.lazy_reset_grad()
        runs.append(np.array(losses))
    assert len(set(runs[0].tolist())) == 6  # fresh masks every step
    np.testing.assert_allclose(runs[0], runs[1], rtol=RTOL, atol=ATOL)


def _clip_artifacts(directory, max_norm: float):
    rng = np.random.default_rng(2)
    w = onnx.numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "W")
    graph = h.make_graph(
        [h.make_node("MatMul", ["x", "W"], ["y"])],
        "clip",
        [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 4])],
        [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 3])],
        [w],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    artifacts.generate_artifacts(
        model,
        requires_grad=["W"],
        loss=artifacts.LossType.MSELoss,
        optimizer=onnxblock.optim.AdamW(clip_grad=onnxblock.optim.ClipGradNorm(max_norm)),
        artifact_directory=directory,
    )


@pytest.mark.parametrize("max_norm", [0.05, 1e3])
def test_clipping_optimizer_and_batch_sizes_match_eager(tmp_path, max_norm):
    """Gradient clipping in the optimizer graph; batches of 2 and 3 rows alternating (one
    graph per signature)."""
    _clip_artifacts(tmp_path, max_norm)
    rng = np.random.default_rng(3)
    batches = [(rng.standard_normal((n, 4)).astype(np.float32), np.ones((n, 3), np.float32)) for n in (2, 3) * 3]
    devices = [("cpu", RerunStreams()), ("cpu", None)] + ([("cuda", None)] if CUDA else [])
    results = []
    for device, streams in devices:
        state = ours.CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
        module = ours.Module(str(tmp_path / "training_model.onnx"), state, device=device)
        if streams is not None:
            _graphed(module, streams)
        optimizer = ours.Optimizer(str(tmp_path / "optimizer_model.onnx"), module)
        losses = []
        for x, target in batches:
            losses.append(float(module(x, target)))
            optimizer.step()
            module.lazy_reset_grad()
        results.append(np.concatenate([losses, module.get_contiguous_parameters().numpy()]))
    for other in results[1:]:
        np.testing.assert_allclose(results[0], other, rtol=RTOL, atol=ATOL)


# ---- what the graphs replay: the specialized graph ------------------------------------------------
def _specialized_and_module(model_proto, feeds, tmp_path):
    """The engine's train module on `model_proto`'s artifacts (our generator, MSE) and its
    graph specialized as the CUDA graphs specialize it."""
    from ort_torch_compat.graph.specialize import specialize

    artifacts.generate_artifacts(
        model_proto,
        requires_grad=[i.name for i in model_proto.graph.initializer if i.data_type == onnx.TensorProto.FLOAT],
        loss=artifacts.LossType.MSELoss,
        optimizer=onnxblock.optim.AdamW(),
        artifact_directory=tmp_path,
    )
    state = ours.CheckpointState.load_checkpoint(str(tmp_path / "checkpoint"))
    engine = ours.Module(str(tmp_path / "training_model.onnx"), state)._engine
    tensors = [*feeds, *engine._train_params]
    return engine, tensors, specialize(engine.train_module, tensors, allow_random=True, fold_constants=True)


def _loss_and_grads(function, tensors):
    leaves = [t.detach().clone().requires_grad_(t.requires_grad) for t in tensors]
    loss = function(*leaves)[0]
    loss.backward()
    return [loss.detach()] + [leaf.grad for leaf in leaves if leaf.requires_grad]


def test_specialized_graph_fuses_exported_gelu(tmp_path):
    """torch's exact GELU exported as ONNX Erf arithmetic becomes one aten.gelu: the same
    loss and gradients to float32 rounding."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.GELU(), torch.nn.Linear(8, 4))
    x = torch.randn(3, 6)
    torch.onnx.export(
        model, (x,), str(tmp_path / "gelu.onnx"), input_names=["x"], output_names=["y"], dynamo=False, opset_version=17
    )
    proto = onnx.load(str(tmp_path / "gelu.onnx"))
    assert "Erf" in [n.op_type for n in proto.graph.node]
    target = torch.randn(3, 4)
    engine, tensors, spec = _specialized_and_module(proto, [x, target], tmp_path)
    targets = [str(n.target) for n in spec.module.graph.nodes if n.op == "call_function"]
    assert "aten.gelu.default" in targets and "aten.erf.default" not in targets
    fused = _loss_and_grads(lambda *t: spec.module(*t, *spec.constants), tensors)
    plain = _loss_and_grads(engine.train_module, tensors)
    for a, b in zip(fused, plain):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_specialize_reads_shapes_the_graph_computes(tmp_path):
    """A Reshape whose shape is computed in the graph (Shape, Gather, Concat: what our
    generator keeps and ORT's folds) specializes: the shape is read during the trace."""
    w = onnx.numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32), "W")
    nodes = [
        h.make_node("MatMul", ["x", "W"], ["h"]),
        h.make_node("Shape", ["h"], ["shape"]),
        h.make_node("Gather", ["shape", "zero"], ["rows"], axis=0),
        h.make_node("Concat", ["rows", "two", "three"], ["new_shape"], axis=0),
        h.make_node("Reshape", ["h", "new_shape"], ["y"]),
    ]
    ints = [
        onnx.numpy_helper.from_array(np.array(v, dtype=np.int64), n)
        for n, v in (("zero", [0]), ("two", [2]), ("three", [3]))
    ]
    graph = h.make_graph(
        nodes,
        "computed_shape",
        [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [5, 4])],
        [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [5, 2, 3])],
        [w, *ints],
    )
    proto = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    x, target = torch.randn(5, 4), torch.randn(5, 2, 3)
    engine, tensors, spec = _specialized_and_module(proto, [x, target], tmp_path)
    targets = {str(n.target) for n in spec.module.graph.nodes if n.op == "call_function"}
    assert not targets & {"aten._local_scalar_dense.default", "aten.cat.default"}  # the shape is folded
    specialized = _loss_and_grads(lambda *t: spec.module(*t, *spec.constants), tensors)
    for a, b in zip(specialized, _loss_and_grads(engine.train_module, tensors)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert "tolist" not in vars(torch.Tensor)  # torch's class as it was after the trace
