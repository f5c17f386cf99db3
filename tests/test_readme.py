"""README.md as executable documentation: every Python and shell block runs as written.

The blocks run in README order in one temporary directory that holds a copy of examples/
(the artifacts the snippets read), as a newcomer pasting them at the root of a clone would:
each Python block in a fresh interpreter, each shell command with `bash -e`, where
`python`, `.venv/bin/python`, `ort-torch-compat` and `torchrun` are this interpreter and
this checkout.  A command that cannot run here is listed in SKIPPED with the reason, and is
checked as far as it can be without running it; nothing else is skipped.
"""
from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys
from typing import Dict, List, NamedTuple

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
FENCE = re.compile(r"^```(?P<language>[a-z]*)\n(?P<body>.*?)^```$", re.M | re.S)
RUN = ("python", "bash")
NOT_RUN = ("text",)  # program output shown in README
TIMEOUT_S = 300

# Shell commands (as written, comment removed) that cannot run in a test, and why.
SKIPPED: Dict[str, str] = {
    'python3 -m venv .venv && .venv/bin/pip install -e ".[test]"':
        "creates a virtual environment and downloads torch and its dependencies (minutes, GBs); "
        "test_install_commands_name_what_pyproject_declares checks the extras it names",
    ".venv/bin/python -m pytest -q": "it is this test suite",
    'pip install "ort_torch_compat @ git+$REPO_URL"': "needs the repository's URL and the network",
    "pip install dist/ort_torch_compat-0.1.0-py3-none-any.whl":
        "would install into the test environment; test_install_commands_name_what_pyproject_declares "
        "checks the wheel's name against pyproject.toml",
    "pip install torch torchvision --index-url https://download.pytorch.org/whl/cpu":
        "downloads torch from PyTorch's index",
    'pip install -e ".[test]"': "would reinstall into the test environment (its extras are checked)",
    "torchrun --nproc_per_node 8 examples/ddp_train.py --device cuda --out ddp_run": "needs 8 CUDA GPUs",
    "ort-torch-compat compile examples/artifacts/mlp_classifier --input features=8x2 --input labels=8":
        "compiles for up to minutes into the user's cache; tests/test_background_compile.py runs the same "
        "command on a fixture",
    "python scripts/benchmark.py --background 0 2 --json bench.json":
        "runs for hours with onnxruntime-training (the benchmark is the instrument, never a test)",
    "python scripts/measure_readme_figures.py --write --skip-quick --benchmark-json bench.json":
        "rewrites README from the report of the benchmark above",
}


class Block(NamedTuple):
    index: int
    language: str
    code: str
    line: int  # 1-based line of the opening fence

    @property
    def name(self) -> str:
        return f"{self.language}-line{self.line}"


def readme_blocks() -> List[Block]:
    text = README.read_text()
    return [Block(i, m["language"], m["body"], text.count("\n", 0, m.start()) + 1)
            for i, m in enumerate(FENCE.finditer(text))]


def shell_commands(code: str) -> List[str]:
    """The block's command lines, each without its trailing comment."""
    commands = []
    for line in code.splitlines():
        command = re.sub(r"\s+#.*$", "", line).strip()
        if command and not command.startswith("#"):
            assert not command.endswith("\\"), f"continued shell lines are not supported: {line!r}"
            commands.append(command)
    return commands


BLOCKS = [b for b in readme_blocks() if b.language in RUN]


def _shim(path: pathlib.Path, target: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\nexec {target} "$@"\n')
    path.chmod(0o755)


@pytest.fixture(scope="module")
def readme_run(tmp_path_factory) -> Dict[int, List[tuple]]:
    """Run every block in order; block index -> [(what, returncode, output)]."""
    work = tmp_path_factory.mktemp("readme")
    shutil.copytree(ROOT / "examples", work / "examples")
    bin_dir = work / ".shims"
    python = f'"{sys.executable}"'
    for name in ("python", "python3"):
        _shim(bin_dir / name, python)
    _shim(bin_dir / "ort-torch-compat", f"{python} -m ort_torch_compat")
    _shim(bin_dir / "torchrun", f"{python} -m torch.distributed.run")
    _shim(work / ".venv" / "bin" / "python", python)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", TMPDIR=str(work), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    results: Dict[int, List[tuple]] = {}
    for block in BLOCKS:
        runs = []
        if block.language == "python":
            script = work / f"readme_block_{block.index}.py"
            script.write_text(block.code)
            done = subprocess.run([sys.executable, script.name], cwd=work, env=env, capture_output=True, text=True,
                                  timeout=TIMEOUT_S)
            runs.append(("python block", done.returncode, done.stdout + done.stderr))
        else:
            for command in shell_commands(block.code):
                if command in SKIPPED:
                    runs.append((command, None, SKIPPED[command]))
                    continue
                done = subprocess.run(["bash", "-e", "-c", command], cwd=work, env=env, capture_output=True,
                                      text=True, timeout=TIMEOUT_S)
                runs.append((command, done.returncode, done.stdout + done.stderr))
        results[block.index] = runs
    return results


@pytest.mark.parametrize("block", BLOCKS, ids=[b.name for b in BLOCKS])
def test_readme_block_runs(block: Block, readme_run):
    for what, returncode, output in readme_run[block.index]:
        if returncode is None:
            continue  # in SKIPPED, with its reason
        assert returncode == 0, f"README line {block.line}: {what} failed:\n{output[-4000:]}"


def test_every_block_is_run_or_declared_output():
    languages = {b.language for b in readme_blocks()}
    assert languages <= set(RUN + NOT_RUN), f"README blocks of unknown language: {languages - set(RUN + NOT_RUN)}"


def test_every_skip_is_still_in_readme():
    commands = {c for b in readme_blocks() if b.language == "bash" for c in shell_commands(b.code)}
    assert set(SKIPPED) <= commands, f"stale SKIPPED entries: {set(SKIPPED) - commands}"


def test_install_commands_name_what_pyproject_declares():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    text = README.read_text()
    for extras in re.findall(r'\.\[([a-z,]+)\]', text):
        assert set(extras.split(",")) <= set(project["optional-dependencies"]), extras
    for version in re.findall(r"ort_torch_compat-([0-9.]+)-py3-none-any\.whl", text):
        assert version == project["version"]
    floor = re.search(r"torch >= ([0-9.]+)", text).group(1)
    assert f"torch>={floor}" in project["dependencies"]


def test_every_figure_is_one_the_measuring_script_makes():
    spec = importlib.util.spec_from_file_location("measure_readme_figures", ROOT / "scripts" / "measure_readme_figures.py")
    measure = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(measure)
    text = README.read_text()
    figures = measure.figures_in(text)
    assert set(figures) == set(measure.KNOWN)
    assert text.count("<!-- fig:") == text.count("<!-- /fig -->") == len(figures)
    assert measure.about(4.6) == "about 5 s" and measure.about(42) == "about 40 s" and measure.about(150) == "about 2 min"


def test_round_trip_claims(tmp_path):
    """README: to-torch -> from-torch gives the state writer's file; byte-identical for one it wrote."""
    from ort_torch_compat.api import CheckpointState
    from ort_torch_compat.cli import main

    artifact = ROOT / "examples" / "artifacts" / "mlp_classifier" / "checkpoint"
    state_written = tmp_path / "state_written"
    CheckpointState.save_checkpoint(CheckpointState.load_checkpoint(artifact), state_written,
                                    include_optimizer_state=True)
    for source, identical in ((artifact, False), (state_written, True)):
        tensors, back = tmp_path / f"{source.name}.safetensors", tmp_path / f"{source.name}.back"
        assert main(["to-torch", str(source), str(tensors), "--optimizer"]) == 0
        assert main(["from-torch", str(tensors), str(source), str(back)]) == 0
        assert (back.read_bytes() == source.read_bytes()) is identical
        assert back.read_bytes() == state_written.read_bytes()
