"""Federated training of ORT artifacts on Flower (ort_torch_compat.federated, docs/federated.md).

Skipped where Flower is not installed (``pip install -e ".[federated]"``), except the checks that
`import ort_torch_compat` does not import Flower and that the federated package names the extra.

* the example (examples/federated_flower.py, Flower's Simulation Runtime in one process): every
  round's global ORT checkpoint is the num_examples-weighted mean of that round's client
  checkpoints, loads (and trains) in onnxruntime-training 1.19.2, and the eval loss goes down;
* failures: clients that drop out, send NaN/Inf, wrong shapes or wrong names; the round
  completes with the others, the bad updates are rejected with a logged reason, the global
  checkpoint stays the mean of the good ones (or the previous model when none is good);
* the deployment engine: SuperLink and two SuperNodes as separate processes on 127.0.0.1,
  the run submitted with ``flwr run`` (slow: about a minute, see its docstring).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "federated_flower.py"
APP_DIR = ROOT / "examples" / "federated_flower_app"
ARTIFACTS = ROOT / "examples" / "artifacts" / "mlp_classifier"
HAVE_FLWR = importlib.util.find_spec("flwr") is not None
needs_flwr = pytest.mark.skipif(not HAVE_FLWR, reason='Flower (flwr) is not installed: pip install -e ".[federated]"')
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")  # Flower's usage telemetry: never from tests


def _env() -> dict:
    env = dict(os.environ, FLWR_TELEMETRY_ENABLED="0", ORT_TORCH_COMPAT_COMPILE="eager")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


# ---- without Flower ------------------------------------------------------------------------
def test_importing_the_library_does_not_import_flower():
    code = (
        "import sys, ort_torch_compat, ort_torch_compat.api; "
        "assert 'flwr' not in sys.modules, 'flwr imported'; print('ok')"
    )
    done = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-2000:]


def test_missing_flower_names_the_extra():
    code = (
        "import sys; sys.modules['flwr'] = None\n"
        "try:\n    import ort_torch_compat.federated\nexcept ImportError as e:\n    print('IMPORTERROR', e)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120)
    assert "IMPORTERROR" in done.stdout and "ort_torch_compat[federated]" in done.stdout, done.stdout + done.stderr


# ---- helpers -------------------------------------------------------------------------------
def _load(path):
    from ort_torch_compat.api import CheckpointState

    return CheckpointState.load_checkpoint(path)


def _trainable(state):
    from ort_torch_compat.federated import ParameterSpec

    spec = ParameterSpec.from_state(state)
    return {name: state.parameters[name].data for name in spec.names}


def assert_weighted_mean(round_dir: pathlib.Path):
    """round_dir/global/checkpoint == sum(n_i * client_i) / sum(n_i) over num_examples.json."""
    counts = json.loads((round_dir / "num_examples.json").read_text())
    assert counts, f"no accepted client in {round_dir}"
    clients = {c: _trainable(_load(round_dir / f"client_{c}" / "checkpoint")) for c in counts}
    total = sum(counts.values())
    merged = _trainable(_load(round_dir / "global" / "checkpoint"))
    for name, value in merged.items():
        assert value.dtype == np.float32
        expected = sum(counts[c] * clients[c][name].astype(np.float64) for c in counts) / total
        np.testing.assert_allclose(value, expected, rtol=2e-6, atol=2e-7, err_msg=f"{round_dir.name} {name}")
    return counts


def _example_module():
    spec = importlib.util.spec_from_file_location("federated_flower_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- the example ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def example_run(tmp_path_factory):
    """`python examples/federated_flower.py --clients 3 --rounds 3 --out DIR`, as a user runs it."""
    if not HAVE_FLWR:
        pytest.skip('Flower (flwr) is not installed: pip install -e ".[federated]"')
    out = tmp_path_factory.mktemp("federated_example")
    started = time.perf_counter()
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--clients", "3", "--rounds", "3", "--out", str(out)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=str(out),
    )
    seconds = time.perf_counter() - started
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return out, done.stdout, seconds


@needs_flwr
def test_example_writes_every_round(example_run):
    out, stdout, seconds = example_run
    for r in (1, 2, 3):
        assert (out / f"round_{r}" / "global" / "checkpoint").is_file()
        assert sorted(json.loads((out / f"round_{r}" / "num_examples.json").read_text())) == ["0", "1", "2"]
        for c in range(3):
            assert (out / f"round_{r}" / f"client_{c}" / "checkpoint").is_file()
        assert f"round {r}: global eval loss" in stdout
    assert seconds < 60, f"the example took {seconds:.1f} s"


@needs_flwr
def test_global_checkpoint_is_the_weighted_mean_of_the_clients(example_run):
    out, _, _ = example_run
    for r in (1, 2, 3):
        counts = assert_weighted_mean(out / f"round_{r}")
        assert len(set(counts.values())) == 3  # unequal shares: the weighting is visible


@needs_flwr
def test_eval_loss_decreases(example_run):
    out, _, _ = example_run
    losses = json.loads((out / "eval_loss.json").read_text())
    values = [losses[str(r)] for r in (1, 2, 3)]
    assert values[0] > values[1] > values[2], values


@needs_flwr
def test_global_checkpoint_resumes_with_a_fresh_optimizer(example_run):
    """The global checkpoint has no optimizer state: a device resumes from it at step 0."""
    from ort_torch_compat.api import Module, Optimizer

    out, _, _ = example_run
    state = _load(out / "round_3" / "global" / "checkpoint")
    assert state._state.optimizer is None
    assert state.properties["federated_round"] == 3
    module = Module(ARTIFACTS / "training_model.onnx", state, ARTIFACTS / "eval_model.onnx")
    optimizer = Optimizer(ARTIFACTS / "optimizer_model.onnx", module)
    module(np.zeros((4, 2), np.float32), np.zeros(4, np.int64))
    optimizer.step()
    assert state._state.optimizer.step == 1


@needs_flwr
def test_global_checkpoint_loads_and_trains_in_onnxruntime_training(example_run, ort_api):
    """ORT 1.19.2 loads every round's global checkpoint, saves it back byte for byte, trains it."""
    out, _, _ = example_run
    for r in (1, 2, 3):
        path = out / f"round_{r}" / "global" / "checkpoint"
        ours = _trainable(_load(path))
        theirs = ort_api.CheckpointState.load_checkpoint(str(path))
        for name, value in ours.items():
            np.testing.assert_array_equal(theirs.parameters[name].data, value)
        assert theirs.properties["federated_round"] == r
        resaved = out / f"ort_resaved_{r}"
        ort_api.CheckpointState.save_checkpoint(theirs, str(resaved), False)
        assert resaved.read_bytes() == path.read_bytes()  # byte-compatible: ORT writes the same file
    module = ort_api.Module(str(ARTIFACTS / "training_model.onnx"), theirs, str(ARTIFACTS / "eval_model.onnx"))
    optimizer = ort_api.Optimizer(str(ARTIFACTS / "optimizer_model.onnx"), module)
    module.train()
    loss = module(np.zeros((4, 2), np.float32), np.zeros(4, np.int64))
    optimizer.step()
    assert np.isfinite(loss)


# ---- failures ------------------------------------------------------------------------------
def _faulty(kind):
    """A client_fn hook of examples/federated_flower.run: client `i` misbehaves as kind[i] says."""
    from ort_torch_compat.federated import PARAM_NAMES_KEY

    def wrap(context, client):
        fault = kind.get(int(context.node_config["partition-id"]))
        if fault is None:
            return client
        fit = client.fit

        def bad_fit(parameters, config):
            if fault == "dropout":
                raise ConnectionError("device went offline")
            arrays, n, metrics = fit(parameters, config)
            if fault == "nan":
                arrays[1] = arrays[1].copy()
                arrays[1].flat[0] = np.nan
            elif fault == "inf":
                arrays[-1] = np.full_like(arrays[-1], np.inf)
            elif fault == "shape":
                arrays[0] = arrays[0][:-1]
            elif fault == "names":
                metrics[PARAM_NAMES_KEY] = json.dumps(list(reversed(json.loads(metrics[PARAM_NAMES_KEY]))))
            return arrays, n, metrics

        client.fit = bad_fit
        return client

    return wrap


@needs_flwr
def test_bad_clients_are_rejected_and_the_round_completes(tmp_path, caplog):
    faults = {2: "dropout", 3: "nan", 4: "shape", 5: "names", 6: "inf"}
    caplog.set_level(logging.WARNING, logger="ort_torch_compat.federated")
    strategy = _example_module().run(7, 2, tmp_path, local_epochs=1, client_fn=_faulty(faults), quiet=True)
    for r in (1, 2):
        round_dir = tmp_path / f"round_{r}"
        counts = assert_weighted_mean(round_dir)  # the mean of the good clients only
        assert sorted(counts) == ["0", "1"]
        rejected = {item["client"]: item["reason"] for item in json.loads((round_dir / "rejected.json").read_text())}
        assert sorted(rejected) == ["3", "4", "5", "6"], rejected
        assert "NaN or Inf" in rejected["3"] and "NaN or Inf" in rejected["6"]
        assert "shape" in rejected["4"] and "names differ" in rejected["5"]
        assert all(np.isfinite(v).all() for v in _trainable(_load(round_dir / "global" / "checkpoint")).values())
    logged = caplog.text
    for client in ("3", "4", "5", "6"):
        assert f"rejected the update of client {client}" in logged
    assert "device went offline" in logged  # the dropout is logged as the round's failure
    assert sorted(strategy.eval_losses) == [1, 2]


@needs_flwr
def test_no_good_update_keeps_the_previous_global_model(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="ort_torch_compat.federated")
    _example_module().run(2, 1, tmp_path, local_epochs=1, client_fn=_faulty({0: "nan", 1: "shape"}), quiet=True)
    initial = _trainable(_load(ARTIFACTS / "checkpoint"))
    merged = _trainable(_load(tmp_path / "round_1" / "global" / "checkpoint"))
    for name in initial:
        np.testing.assert_array_equal(merged[name], initial[name])
    assert json.loads((tmp_path / "round_1" / "num_examples.json").read_text()) == {}
    assert "global model is unchanged" in caplog.text


@needs_flwr
def test_client_refuses_bad_server_parameters():
    from ort_torch_compat.federated import PARAM_NAMES_KEY, OrtClient

    rng = np.random.default_rng(0)
    data = [rng.normal(size=(40, 2)).astype(np.float32), rng.integers(0, 3, 40).astype(np.int64)]
    client = OrtClient(ARTIFACTS, data, data, batch_size=16)
    good = client.get_parameters({})
    names = client.spec.names_json()
    config = {PARAM_NAMES_KEY: names, "local_epochs": 1, "learning_rate": 0.01, "server_round": 1}
    with pytest.raises(ValueError, match="names differ"):
        client.fit(good, {**config, PARAM_NAMES_KEY: json.dumps(sorted(json.loads(names), reverse=True))})
    with pytest.raises(ValueError, match="parameter names"):
        client.fit(good, {k: v for k, v in config.items() if k != PARAM_NAMES_KEY})
    with pytest.raises(ValueError, match="shape"):
        client.fit([a.T for a in good], config)  # the 2-D ones transposed
    with pytest.raises(ValueError, match="NaN"):
        client.fit([np.full_like(good[0], np.nan)] + good[1:], config)
    with pytest.raises(ValueError, match="expected 6 arrays"):
        client.fit(good[:-1], config)
    for name, value in zip(client.spec.names, good):  # nothing was written into the state
        np.testing.assert_array_equal(client.state.parameters[name].data, value)


@needs_flwr
def test_each_round_starts_a_fresh_optimizer_with_the_servers_learning_rate():
    from ort_torch_compat.federated import PARAM_NAMES_KEY, OrtClient

    rng = np.random.default_rng(1)
    data = [rng.normal(size=(40, 2)).astype(np.float32), rng.integers(0, 3, 40).astype(np.int64)]
    client = OrtClient(ARTIFACTS, data, data, batch_size=16)
    config = {PARAM_NAMES_KEY: client.spec.names_json(), "local_epochs": 2, "learning_rate": 0.02, "server_round": 1}
    start = client.get_parameters({})
    arrays, n, metrics = client.fit(start, config)
    assert n == 40 and json.loads(metrics[PARAM_NAMES_KEY]) == list(client.spec.names)
    assert client.state._state.optimizer.step == 6  # 2 epochs of ceil(40 / 16) steps
    assert client.optimizer.get_learning_rate() == pytest.approx(0.02)
    client.fit(start, {**config, "server_round": 2, "learning_rate": 0.005})
    assert client.state._state.optimizer.step == 6  # not 12: the moments and step count were reset
    assert client.optimizer.get_learning_rate() == pytest.approx(0.005)
    loss, n_eval, _ = client.evaluate(arrays, config)
    assert n_eval == 40 and np.isfinite(loss)


# ---- deployment engine ---------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _group_members(groups) -> list:
    """The processes of the given process groups (the started programs and their children)."""
    members = []
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[2]) in groups:  # field 5: the process group
                members.append(int(entry.name))
    return members


def _listening_addresses(pids) -> set:
    """Local addresses the given processes listen on (Linux /proc), to check loopback only."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = pathlib.Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                found.add(fields[1].split(":")[0])
    return found


@needs_flwr
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="checks the listening sockets in /proc")
@pytest.mark.skipif(
    HAVE_FLWR and shutil.which("flower-superlink", path=os.path.dirname(sys.executable)) is None,
    reason="Flower's command-line programs are not beside this interpreter",
)
def test_deployment_engine_superlink_and_supernodes(tmp_path):
    """Flower's deployment engine: a SuperLink and two SuperNodes, each a separate process (each
    spawning Flower's ServerApp / ClientApp processes), on 127.0.0.1 only, the Flower App
    (examples/federated_flower_app) submitted with ``flwr run``, one round.

    Slow by nature, about a minute on 2 cores: every ClientApp message starts a Python process
    that imports torch, and the SuperNodes poll the SuperLink.  Kept to one round of two nodes;
    every process runs under a time limit and is ended with its process group."""
    bin_dir = pathlib.Path(sys.executable).parent
    home, out, logs = tmp_path / "flwr_home", tmp_path / "out", tmp_path / "logs"
    for folder in (home, out, logs):
        folder.mkdir()
    link_port = _free_port()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = "127.0.0.1:{link_port}"\ninsecure = true\n'
    )
    env = dict(_env(), FLWR_HOME=str(home), PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    processes = []

    def start(name, *args):
        log = open(logs / f"{name}.log", "w")
        processes.append(
            (
                name,
                subprocess.Popen(
                    [str(bin_dir / args[0]), *args[1:]],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=str(tmp_path),
                    start_new_session=True,
                ),
            )
        )

    deadline = time.monotonic() + 240
    try:
        start(
            "superlink",
            "flower-superlink",
            "--insecure",
            "--host",
            "127.0.0.1",
            "--port",
            str(link_port),
            "--disable-runtime-dependency-installation",
        )
        for node in (0, 1):
            start(
                f"supernode{node}",
                "flower-supernode",
                "--insecure",
                "--superlink",
                f"127.0.0.1:{link_port}",
                "--host",
                "127.0.0.1",
                "--port",
                str(_free_port()),
                "--max-wait-time",
                "120",
                "--node-config",
                f"partition-id={node} num-partitions=2",
            )
        run_config = (
            f'artifacts="{ARTIFACTS}" out-dir="{out}" num-server-rounds=1 min-clients=2 '
            f"local-epochs=2 learning-rate=0.01"
        )
        submitted = None
        while time.monotonic() < deadline:  # the SuperLink takes a few seconds to listen
            submitted = subprocess.run(
                [str(bin_dir / "flwr"), "run", str(APP_DIR), "local", "--run-config", run_config],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                cwd=str(tmp_path),
            )
            if submitted.returncode == 0:
                break
            time.sleep(2)
        assert submitted is not None and submitted.returncode == 0, submitted.stdout + submitted.stderr
        losses = out / "eval_loss.json"
        while time.monotonic() < deadline and not (losses.exists() and "1" in json.loads(losses.read_text() or "{}")):
            for name, process in processes:
                assert process.poll() is None, f"{name} exited: " + (logs / f"{name}.log").read_text()[-3000:]
            time.sleep(1)
        assert losses.exists(), "no round finished in time:\n" + "\n".join(
            f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(logs.iterdir())
        )
        listening = _listening_addresses(_group_members({p.pid for _, p in processes}))
        assert listening and listening <= {"0100007F", "00000000000000000000000001000000"}, listening  # 127.0.0.1, ::1
    finally:
        for _, process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for _, process in processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=20)
    counts = assert_weighted_mean(out / "round_1")
    assert sorted(counts) == ["0", "1"]
    assert json.loads(losses.read_text())["1"] > 0


# ---- the strategy wrapper and the simulation backend, directly ------------------------------
@needs_flwr
def test_pickled_payload_is_rejected_without_unpickling(tmp_path):
    """An update whose array bytes are a pickle (object array) is refused at decoding: Flower
    reads arrays with allow_pickle=False, and the refusal is the update's rejection reason."""
    import io

    from flwr.common import Code, FitRes, Parameters, Status, ndarrays_to_parameters
    from flwr.server.client_proxy import ClientProxy

    from ort_torch_compat.federated import PARAM_NAMES_KEY, CheckpointStrategy

    class Proxy(ClientProxy):
        def get_properties(self, *args, **kwargs):
            raise NotImplementedError

        get_parameters = fit = evaluate = reconnect = get_properties

    strategy = CheckpointStrategy(ARTIFACTS / "checkpoint", tmp_path)
    good = [a + 1 for a in _trainable(_load(ARTIFACTS / "checkpoint")).values()]
    buffer = io.BytesIO()
    np.save(buffer, np.array([{"payload": "not data"}], dtype=object), allow_pickle=True)
    pickled = Parameters(
        tensors=[buffer.getvalue()] + ndarrays_to_parameters(good).tensors[1:], tensor_type="numpy.ndarray"
    )
    names = strategy.spec.names_json()
    ok, status = (
        FitRes(Status(Code.OK, ""), ndarrays_to_parameters(good), 10, {PARAM_NAMES_KEY: names, "client_id": "a"}),
        None,
    )
    bad = FitRes(Status(Code.OK, ""), pickled, 10, {PARAM_NAMES_KEY: names, "client_id": "b"})
    parameters, _ = strategy.aggregate_fit(1, [(Proxy("a"), ok), (Proxy("b"), bad)], [])
    assert status is None and parameters is not None
    assert [client for client, _ in strategy.rejected[1]] == ["b"]
    assert "undecodable" in strategy.rejected[1][0][1] and "allow_pickle" in strategy.rejected[1][0][1]
    merged = _trainable(_load(tmp_path / "round_1" / "global" / "checkpoint"))
    for value, expected in zip(merged.values(), good):
        np.testing.assert_array_equal(value, expected.astype(np.float32))


@needs_flwr
def test_in_process_simulation_restores_flowers_backend_module():
    import ort_torch_compat.federated.simulation as simulation

    before = sys.modules.get(simulation._RAY_BACKEND_MODULE)
    with simulation._in_process_backend():
        patched = sys.modules[simulation._RAY_BACKEND_MODULE]
        assert patched.RayBackend is simulation.InProcessBackend
    assert sys.modules.get(simulation._RAY_BACKEND_MODULE) is before
    with pytest.raises(ValueError, match="backend"):
        simulation.run_simulation(None, None, 1, backend="threads")


@needs_flwr
def test_wire_order_is_the_same_for_the_artifacts_and_a_saved_checkpoint(tmp_path):
    """The artifacts' checkpoint lists parameters in initializer order, a saved one in name
    order: the wire order (ORT's API order) must not depend on which file a device loaded."""
    from ort_torch_compat.federated import ParameterSpec
    from ort_torch_compat.federated.params import write_checkpoint

    original = _load(ARTIFACTS / "checkpoint")
    write_checkpoint(original, tmp_path / "checkpoint")
    resaved = _load(tmp_path / "checkpoint")
    assert list(original._state.parameters) != list(resaved._state.parameters)  # the files differ in order
    assert ParameterSpec.from_state(original) == ParameterSpec.from_state(resaved)
    assert list(ParameterSpec.from_state(original).names) == [name for name, _ in original.parameters]
