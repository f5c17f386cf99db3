"""TF32 switching around the engines' CUDA calls (engine/precision.py), testable without a GPU:
torch's TF32 flags exist on CPU builds, and an engine is made to take its CUDA code path by
pretending its device is CUDA where the precision is chosen.

Checked: inside a train, eval and optimizer step of a CUDA engine TF32 is off (on when opted
in through the session config entry or the CUDA provider option), the caller's settings are
back afterwards, also after a failing step, and CPU engines never touch the flags."""

from __future__ import annotations

import warnings

import pytest
import torch

from ort_torch_compat.api import CheckpointState, Module, Optimizer
from ort_torch_compat.engine import optimizer_engine, precision, training_engine
from ort_torch_compat.engine.precision import CONFIG_KEY, tf32_requested, tf32_scope
from ort_torch_compat.legacy import SessionOptions
from ort_torch_compat.testing.scenario import make_batch
from tests.conftest import FIXTURES, load_spec

NEW_API = precision._new_api()
LEAVES = [("cuda", "matmul"), ("cuda", "conv"), ("cuda", "rnn")]


def _read(getter):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return getter()
    except RuntimeError:  # torch's "mix of the legacy and new APIs" error is part of the state
        return "error"


def settings() -> tuple:
    """Everything a user can read about float32 precision on CUDA (legacy and new API)."""
    legacy = (
        _read(lambda: torch.backends.cuda.matmul.allow_tf32),
        _read(torch.get_float32_matmul_precision),
        _read(lambda: torch.backends.cudnn.allow_tf32),
    )
    if not NEW_API:
        return legacy
    nodes = LEAVES + [("cuda", "all"), ("generic", "all")]
    return legacy + tuple(torch._C._get_fp32_precision_getter(*node) for node in nodes)


def tf32_in_effect() -> tuple:
    """(cuBLAS matmul, cuDNN conv, cuDNN RNN) use TF32, as the kernels see it."""
    if NEW_API:
        return tuple(torch._C._get_fp32_precision_getter(*leaf) == "tf32" for leaf in LEAVES)
    cudnn = torch.backends.cudnn.allow_tf32
    return (torch.get_float32_matmul_precision() != "highest", cudnn, cudnn)


def _reset() -> None:
    """torch's defaults: matmul float32, cuDNN TF32."""
    torch.set_float32_matmul_precision("highest")
    if NEW_API:
        for node in [("generic", "all"), ("cuda", "all"), ("cuda", "matmul")]:
            torch._C._set_fp32_precision_setter(*node, "none")
    torch.backends.cudnn.allow_tf32 = True


@pytest.fixture(autouse=True)
def torch_defaults():
    _reset()
    yield
    _reset()


b = torch.backends
USER_SETTINGS = {  # what a user may have set before calling us
    "default": lambda: None,
    "legacy cudnn off": lambda: setattr(b.cudnn, "allow_tf32", False),
    "legacy matmul on": lambda: setattr(b.cuda.matmul, "allow_tf32", True),
    "matmul precision medium": lambda: torch.set_float32_matmul_precision("medium"),
}
if NEW_API:
    USER_SETTINGS.update(
        {
            "new: everything tf32": lambda: setattr(b, "fp32_precision", "tf32"),
            "new: cuda ieee": lambda: setattr(b.cudnn, "fp32_precision", "ieee"),
            "new: matmul tf32": lambda: setattr(b.cuda.matmul, "fp32_precision", "tf32"),
            "new: conv ieee, rnn tf32": lambda: setattr(b.cudnn.conv, "fp32_precision", "ieee"),
            "new: tf32 but conv ieee": lambda: (
                setattr(b, "fp32_precision", "tf32"),
                setattr(b.cudnn.conv, "fp32_precision", "ieee"),
            ),
        }
    )


@pytest.mark.parametrize("tf32", [False, True], ids=["float32", "tf32"])
@pytest.mark.parametrize("user", list(USER_SETTINGS))
def test_scope_sets_inside_and_restores_the_callers_settings(user, tf32):
    USER_SETTINGS[user]()
    before = settings()
    with tf32_scope(tf32):
        assert tf32_in_effect() == (tf32,) * 3
    assert settings() == before
    with pytest.raises(KeyError):
        with tf32_scope(tf32):
            assert tf32_in_effect() == (tf32,) * 3
            raise KeyError("a failing step")
    assert settings() == before


@pytest.mark.parametrize("tf32", [False, True], ids=["float32", "tf32"])
def test_the_legacy_api_path(monkeypatch, tf32):
    """torch < 2.9 has only allow_tf32 / set_float32_matmul_precision."""
    monkeypatch.setattr(precision, "_new_api", lambda: False)
    legacy = settings()[:3]
    with tf32_scope(tf32):
        assert torch.backends.cudnn.allow_tf32 is tf32
        assert (torch.get_float32_matmul_precision() != "highest") is tf32
    assert settings()[:3] == legacy


def test_tf32_requested_sources():
    assert tf32_requested() is False
    options = SessionOptions()
    assert tf32_requested(options) is False
    options.add_session_config_entry(CONFIG_KEY, "1")
    assert tf32_requested(options) is True
    assert tf32_requested(options, {"use_tf32": "0"}) is False  # the provider's own option wins
    assert tf32_requested(None, {"use_tf32": 1}) is True
    assert tf32_requested(None, {"device_id": "0"}) is False
    options.add_session_config_entry(CONFIG_KEY, "0")
    assert tf32_requested(options) is False
    options.add_session_config_entry(CONFIG_KEY, "sometimes")
    with pytest.raises(ValueError, match=CONFIG_KEY):
        tf32_requested(options)


def test_tf32_requested_reads_onnxruntimes_session_options():
    ort = pytest.importorskip("onnxruntime")
    options = ort.SessionOptions()
    assert tf32_requested(options) is False  # ORT raises for an absent entry
    options.add_session_config_entry(CONFIG_KEY, "1")
    assert tf32_requested(options) is True


# ---- engines --------------------------------------------------------------------------
@pytest.fixture
def as_cuda(monkeypatch):
    """Engines created now take the CUDA path of precision selection, on the CPU."""
    real = precision.precision_of
    monkeypatch.setattr(
        training_engine, "precision_of", lambda device, *args, **kwargs: real(torch.device("cuda"), *args, **kwargs)
    )


def _module(config: dict):
    directory = FIXTURES / "mlp_mse_adamw_op17"
    options = SessionOptions()
    for key, value in config.items():
        options.add_session_config_entry(key, value)
    state = CheckpointState.load_checkpoint(directory / "checkpoint")
    module = Module(directory / "training_model.onnx", state, directory / "eval_model.onnx", session_options=options)
    batch = make_batch(load_spec(directory), 1, 0)
    return module, Optimizer(directory / "optimizer_model.onnx", module), [batch[n] for n in module.input_names()]


def _observe(module, monkeypatch) -> list:
    """Record the TF32 flags inside the train step's graph, the eval step's graph and the optimizer kernel."""
    seen = []
    engine = module._engine
    train_graph, eval_graph, adamw = engine.train_runner.eager, engine._eval_direct, optimizer_engine.adamw_step
    monkeypatch.setattr(
        engine.train_runner, "eager", lambda *t: seen.append(("train", tf32_in_effect())) or train_graph(*t)
    )
    monkeypatch.setattr(engine, "_eval_direct", lambda *t: seen.append(("eval", tf32_in_effect())) or eval_graph(*t))
    monkeypatch.setattr(
        optimizer_engine, "adamw_step", lambda *a, **k: seen.append(("optimizer", tf32_in_effect())) or adamw(*a, **k)
    )
    return seen


def _steps(module, optimizer, feeds) -> None:
    module.train()
    module(*feeds)
    optimizer.step()
    module.eval()
    module(*feeds)


@pytest.mark.parametrize(
    "config, tf32",
    [({}, False), ({CONFIG_KEY: "0"}, False), ({CONFIG_KEY: "1"}, True)],
    ids=["default", "config 0", "config 1"],
)
def test_cuda_engine_steps_switch_tf32_and_restore(as_cuda, monkeypatch, config, tf32):
    module, optimizer, feeds = _module(config)
    assert module._engine.tf32 is tf32
    seen = _observe(module, monkeypatch)
    torch.backends.cuda.matmul.allow_tf32 = not tf32  # the user's setting is the opposite of ours
    torch.backends.cudnn.allow_tf32 = not tf32
    before = settings()
    _steps(module, optimizer, feeds)
    assert [step for step, _ in seen] == ["train", "optimizer", "eval"]
    assert all(flags == (tf32,) * 3 for _, flags in seen), seen
    assert settings() == before


def test_cuda_engine_restores_after_a_failing_step(as_cuda, monkeypatch):
    module, optimizer, feeds = _module({})
    before = settings()
    inside = []

    def failing(*tensors):
        inside.append(tf32_in_effect())
        raise RuntimeError("the kernel failed")

    monkeypatch.setattr(module._engine.train_runner, "eager", failing)
    monkeypatch.setattr(module._engine, "train_module", failing)  # what the failure explanation re-runs
    with pytest.raises(Exception, match="the kernel failed"):
        module(*feeds)
    assert inside and inside[0] == (False, False, False)
    assert settings() == before


def test_cpu_engines_never_touch_the_flags(monkeypatch):
    def forbidden(tf32):
        raise AssertionError("a CPU engine switched TF32")

    monkeypatch.setattr(precision, "tf32_scope", forbidden)
    for config in ({}, {CONFIG_KEY: "1"}):
        module, optimizer, feeds = _module(config)
        engine = module._engine
        assert engine.tf32 is None
        # the steps are the class's own methods: no wrapper, no per-step cost
        assert "train_step" not in vars(engine) and "eval_step" not in vars(engine)
        assert "step" not in vars(optimizer._optimizer)
        before = settings()
        seen = _observe(module, monkeypatch)
        _steps(module, optimizer, feeds)
        assert all(flags == (False, True, True) for _, flags in seen), seen  # torch's defaults, untouched
        assert settings() == before


# ---- the legacy TrainingSession: CUDA provider options ----------------------------------
from tests.test_legacy_session import _LinearMSE, batches, feed, make_params  # noqa: E402


@pytest.fixture(scope="module")
def model_bytes() -> bytes:
    """test_legacy_session's loss-in-graph linear model."""
    import io

    torch.manual_seed(0)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            _LinearMSE(),
            (torch.randn(5, 4), torch.randn(5, 3)),
            buffer,
            dynamo=False,
            opset_version=17,
            input_names=["x", "y"],
            output_names=["loss", "pred"],
            dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}, "pred": {0: "batch"}},
        )
    return buffer.getvalue()


def _legacy_session(monkeypatch, model, provider_options, sess_options=None):
    """A legacy session whose chosen provider is CUDAExecutionProvider with `provider_options`;
    the device stays the CPU (there may be no GPU), the engine takes the CUDA precision path."""
    from ort_torch_compat.legacy import training_session as legacy_session
    from ort_torch_compat.legacy.session_info import CPU

    def resolve(providers, options):
        return (
            ["CUDAExecutionProvider", CPU],
            [{k: str(v) for k, v in provider_options.items()}, {}],
            torch.device("cpu"),
        )

    monkeypatch.setattr(legacy_session, "resolve_providers", resolve)
    return legacy_session.TrainingSession(
        model, make_params("AdamOptimizer"), sess_options, providers=[("CUDAExecutionProvider", provider_options)]
    )


def _config(value):
    options = SessionOptions()
    options.add_session_config_entry(CONFIG_KEY, value)
    return options


@pytest.mark.parametrize(
    "provider_options, sess_options, tf32",
    [
        ({"device_id": 0}, None, False),
        ({"use_tf32": 0}, None, False),
        ({"use_tf32": 1}, None, True),
        ({}, "1", True),
        ({"use_tf32": "0"}, "1", False),  # the provider's own option wins
    ],
    ids=["default", "use_tf32 0", "use_tf32 1", "config 1", "provider option wins"],
)
def test_legacy_cuda_provider_option_use_tf32(as_cuda, monkeypatch, model_bytes, provider_options, sess_options, tf32):
    session = _legacy_session(
        monkeypatch, model_bytes, provider_options, None if sess_options is None else _config(sess_options)
    )
    assert session._engine.tf32 is tf32
    seen = []
    train_graph = session._engine.train_runner.eager
    monkeypatch.setattr(
        session._engine.train_runner, "eager", lambda *t: seen.append(("train", tf32_in_effect())) or train_graph(*t)
    )
    session._optimizer.register_step_pre_hook(lambda *args: seen.append(("optimizer", tf32_in_effect())))
    torch.backends.cuda.matmul.allow_tf32 = not tf32
    torch.backends.cudnn.allow_tf32 = not tf32
    before = settings()
    ((x, y),) = batches(1, seed=3)
    session.run(["loss"], feed(x, y, 0.1))
    assert [step for step, _ in seen] == ["train", "optimizer"]
    assert all(flags == (tf32,) * 3 for _, flags in seen), seen
    assert settings() == before


def test_legacy_cpu_session_never_touches_the_flags(monkeypatch, model_bytes):
    from ort_torch_compat.legacy import TrainingSession

    monkeypatch.setattr(precision, "tf32_scope", lambda tf32: pytest.fail("a CPU session switched TF32"))
    session = TrainingSession(
        model_bytes, make_params("AdamOptimizer"), _config("1"), providers=[("CPUExecutionProvider", {"use_tf32": 1})]
    )
    assert session._engine.tf32 is None
    before = settings()
    ((x, y),) = batches(1, seed=4)
    session.run(["loss"], feed(x, y, 0.1))
    assert settings() == before
