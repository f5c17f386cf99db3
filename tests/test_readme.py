"""README.md and docs/*.md as executable documentation: every Python and shell block runs as written.

Each page's blocks run in page order in a temporary directory of their own that holds a copy of
examples/ (the artifacts the snippets read), as a newcomer pasting them at the root of a clone
would: each Python block in a fresh interpreter, each shell command with `bash -e`.  The
project's virtual environment is `.venv/` there: `.venv/bin/python`, `.venv/bin/ort-torch-compat`
and `.venv/bin/torchrun` are this interpreter and this checkout.  The bare `python`, `python3`,
`pip`, `ort-torch-compat` and `torchrun` on PATH fail, so a command that would need an
activated virtual environment fails here too.  The compile cache and temporary files go to the
test's temporary directories, never the user's.  A command that cannot run here is listed in
SKIPPED with the reason, and is checked as far as it can be without running it; nothing else is
skipped.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time
from typing import Callable, Dict, List, NamedTuple

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README] + sorted((ROOT / "docs").glob("*.md"))
FENCE = re.compile(r"^```(?P<language>[a-z]*)\n(?P<body>.*?)^```$", re.M | re.S)
RUN = ("python", "bash")
NOT_RUN = ("text",)  # program output, diagrams, or a call shown for reference (never code to paste)
TIMEOUT_S = 300
NEEDS_GPU = "needs a CUDA GPU (tests/test_cuda.py and tests/test_ddp.py run the CUDA paths where one exists)"
NEEDS_8_GPUS = "needs 8 CUDA GPUs (tests/test_ddp.py runs the same example with torchrun on 2 CPU processes)"
CLONE_INSTALL = (
    "creates a virtual environment and downloads torch and its dependencies (minutes, GBs); "
    "test_install_commands_name_what_pyproject_declares checks the extras it names"
)

# Shell commands (as written, comment removed) that cannot run in a test, and why.
SKIPPED: Dict[str, str] = {
    'python3 -m venv .venv && .venv/bin/pip install -e ".[test]"': CLONE_INSTALL,
    "python3 -m venv .venv && .venv/bin/pip install torch torchvision --index-url https://download.pytorch.org/whl/cpu "
    '&& .venv/bin/pip install -e ".[test]"': "downloads torch from PyTorch's index; " + CLONE_INSTALL,
    'python3 -m venv .venv && .venv/bin/pip install -e ".[test,ort]"': "downloads onnxruntime-training 1.19.2 too; CI (.ci/run) runs this install",
    ".venv/bin/python -m pytest -q": "it is this test suite",
    'python3 -m venv .venv-docs && .venv-docs/bin/pip install mkdocs-material "mkdocstrings[python]" '
    "&& .venv-docs/bin/mkdocs serve": "downloads MkDocs and serves until interrupted; CI (.ci/run) installs the same "
    "packages and runs `mkdocs build --strict`",
    'git clone "$REPO_URL" ort_torch_compat': "needs the repository's URL and the network",
    ".venv/bin/pip wheel . -w dist --no-deps": "needs the source tree (the test's directory holds only examples/) and builds in an isolated environment "
    "that installs setuptools; test_install_commands_name_what_pyproject_declares checks the wheel's name "
    "against pyproject.toml",
    "python3 -m venv app-venv && app-venv/bin/pip install dist/ort_torch_compat-0.1.0-py3-none-any.whl": "needs the wheel of the line above and downloads torch",
    'python3 -m venv .venv && .venv/bin/pip install "ort_torch_compat @ git+$REPO_URL"': "needs the repository's URL and the network",
    "python3 -m venv .venv && .venv/bin/pip install torch torchvision --index-url https://download.pytorch.org/whl/cpu "
    '&& .venv/bin/pip install "ort_torch_compat @ git+$REPO_URL"': "needs the repository's URL and the network",
    "python3 -m venv .venv-gen && .venv-gen/bin/pip install onnx numpy flatbuffers && .venv-gen/bin/pip install --no-deps .": "downloads onnx, numpy and flatbuffers; CI (.ci/run) runs the same commands on Python 3.13 and trains "
    "the artifacts they make with onnxruntime-training",
    ".venv-gen/bin/python scripts/generate_fixture_artifacts.py gen_out --fixtures tests/fixtures/artifacts": "needs the environment of the line above; CI (.ci/run) runs it",
    '.venv/bin/pip install -e ".[federated]"': "downloads Flower; CI (.ci/run) installs the same extra",
    ".venv/bin/python examples/federated_flower.py --clients 3 --rounds 3 --out fl_run": "needs the federated extra (Flower, Python >= 3.11); tests/test_federated.py runs this example and checks "
    "every file it writes",
    ".venv/bin/pip install onnxscript": "downloads onnxscript (the examples here use dynamo=False instead)",
    ".venv/bin/torchrun --nproc_per_node 8 examples/ddp_train.py --device cuda --out ddp_run": NEEDS_8_GPUS,
    ".venv/bin/python -m pytest -q tests/test_cuda.py tests/test_cuda_graphs.py": NEEDS_GPU
    + "; the full suite above includes them",
    "bash scripts/gpu_check.sh": NEEDS_GPU + "; run on an H100 for docs/cuda.md (its log: docs/gpu-check/)",
    ".venv/bin/ort-torch-compat compile examples/artifacts/mlp_classifier --input features=8x2 --input labels=8": "compiles for up to minutes with a C++ compiler; tests/test_background_compile.py runs the same command on a "
    "fixture",
    ".venv/bin/python scripts/benchmark.py --models all --size tiny --rounds 3 "
    "--backends ort ours --background 0 2 --json tiny.json": "runs for about 70 minutes with onnxruntime-training (the benchmark is the instrument, never a test)",
    ".venv/bin/python scripts/benchmark.py --models lora vit bert lstm --size tiny --rounds 3 --fresh-seconds 120 "
    "--backends ort ours --json fresh.json": "runs for about an hour with onnxruntime-training (the benchmark is the instrument, never a test)",
    ".venv/bin/python scripts/benchmark.py --background 0 2 --json bench.json": "runs for hours with onnxruntime-training (the benchmark is the instrument, never a test)",
    ".venv/bin/python scripts/measure_readme_figures.py --write --skip-quick --benchmark-json bench.json": "rewrites README and docs/performance.md from the report of the benchmark above",
}


class Block(NamedTuple):
    page: str  # path relative to the repository root
    index: int
    language: str
    code: str
    line: int  # 1-based line of the opening fence

    @property
    def name(self) -> str:
        return f"{self.page}:{self.language}-line{self.line}"


def page_blocks(page: pathlib.Path) -> List[Block]:
    text = page.read_text()
    name = page.relative_to(ROOT).as_posix()
    return [
        Block(name, i, m["language"], m["body"], text.count("\n", 0, m.start()) + 1)
        for i, m in enumerate(FENCE.finditer(text))
    ]


def readme_blocks() -> List[Block]:
    return page_blocks(README)


def all_blocks() -> List[Block]:
    return [b for page in PAGES for b in page_blocks(page)]


def shell_commands(code: str) -> List[str]:
    """The block's command lines, each without its trailing comment."""
    commands = []
    for line in code.splitlines():
        command = re.sub(r"\s+#.*$", "", line).strip()
        if command and not command.startswith("#"):
            assert not command.endswith("\\"), f"continued shell lines are not supported: {line!r}"
            commands.append(command)
    return commands


BLOCKS = [b for b in all_blocks() if b.language in RUN]


def _shim(path: pathlib.Path, target: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f'#!/bin/sh\nexec {target} "$@"\n')
    path.chmod(0o755)


def _run_page(page: str, work: pathlib.Path, cache: pathlib.Path) -> Dict[int, List[tuple]]:
    """Run every block of one page in order in `work`; block index -> [(what, returncode, output, seconds)]."""
    shutil.copytree(ROOT / "examples", work / "examples")
    bin_dir = work / ".shims"
    python = f'"{sys.executable}"'
    for name in ("python", "python3", "pip", "ort-torch-compat", "torchrun"):
        _shim(
            bin_dir / name,
            f"sh -c 'echo \"{name}: not on PATH (no virtual environment is activated): "
            f"use .venv/bin/{name}\" >&2; exit 127'",
        )
    _shim(work / ".venv" / "bin" / "python", python)
    _shim(work / ".venv" / "bin" / "ort-torch-compat", f"{python} -m ort_torch_compat")
    _shim(work / ".venv" / "bin" / "torchrun", f"{python} -m torch.distributed.run")
    env = dict(
        os.environ,
        PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        TMPDIR=str(work),
        OMP_NUM_THREADS="1",
        ORT_TORCH_COMPAT_CACHE_DIR=str(cache),
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    results: Dict[int, List[tuple]] = {}
    for block in (b for b in BLOCKS if b.page == page):
        runs = []
        start = time.perf_counter()
        if block.language == "python":
            script = work / f"block_{block.index}.py"
            script.write_text(block.code)
            done = subprocess.run(
                [sys.executable, script.name], cwd=work, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
            )
            runs.append(("python block", done.returncode, done.stdout + done.stderr, time.perf_counter() - start))
        else:
            for command in shell_commands(block.code):
                if command in SKIPPED:
                    runs.append((command, None, SKIPPED[command], 0.0))
                    continue
                start = time.perf_counter()
                done = subprocess.run(
                    ["bash", "-e", "-c", command], cwd=work, env=env, capture_output=True, text=True, timeout=TIMEOUT_S
                )
                runs.append((command, done.returncode, done.stdout + done.stderr, time.perf_counter() - start))
        results[block.index] = runs
    return results


@pytest.fixture(scope="module")
def page_run(tmp_path_factory) -> Callable[[str], Dict[int, List[tuple]]]:
    """page -> its blocks' results, each page run once, in its own temporary directory."""
    cache = tmp_path_factory.mktemp("compile-cache")
    done: Dict[str, Dict[int, List[tuple]]] = {}

    def run(page: str) -> Dict[int, List[tuple]]:
        if page not in done:
            done[page] = _run_page(page, tmp_path_factory.mktemp(re.sub(r"\W", "_", page)), cache)
        return done[page]

    return run


@pytest.mark.parametrize("block", BLOCKS, ids=[b.name for b in BLOCKS])
def test_block_runs(block: Block, page_run):
    for what, returncode, output, _ in page_run(block.page)[block.index]:
        if returncode is None:
            continue  # in SKIPPED, with its reason
        assert returncode == 0, f"{block.page} line {block.line}: {what} failed:\n{output[-4000:]}"


def test_every_block_is_run_or_declared_output():
    for block in all_blocks():
        assert block.language in RUN + NOT_RUN, (
            f"{block.page} line {block.line}: block of unknown language "
            f"{block.language!r} (give every fence a language)"
        )


def test_every_skip_is_still_in_the_docs():
    commands = {c for b in all_blocks() if b.language == "bash" for c in shell_commands(b.code)}
    assert set(SKIPPED) <= commands, f"stale SKIPPED entries: {set(SKIPPED) - commands}"


def test_shell_blocks_need_no_activated_environment():
    """Every command names its interpreter or tool by path (.venv/bin/...), or creates the venv."""
    bare = re.compile(r"(^|&&\s*|;\s*)(python|pip|ort-torch-compat|torchrun|mkdocs)\s")
    for block in all_blocks():
        if block.language == "bash":
            for command in shell_commands(block.code):
                assert not bare.search(command), f"{block.page} line {block.line}: {command!r} needs an activated venv"


def test_readme_test_command_is_there_once():
    """CI (.ci/run) runs README's test command; README has exactly one."""
    lines = [c for b in readme_blocks() if b.language == "bash" for c in shell_commands(b.code)]
    assert lines.count(".venv/bin/python -m pytest -q") == 1
    first_screen = "\n".join(README.read_text().splitlines()[:40])
    assert ".venv/bin/python -m pytest -q" in first_screen and "pip install -e" in first_screen


def test_install_commands_name_what_pyproject_declares():
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    text = "\n".join(page.read_text() for page in PAGES)
    for extras in re.findall(r"\.\[([a-z,]+)\]", text):
        assert set(extras.split(",")) <= set(project["optional-dependencies"]), extras
    for version in re.findall(r"ort_torch_compat-([0-9.]+)-py3-none-any\.whl", text):
        assert version == project["version"]
    floor = re.search(r"torch >= ([0-9.]+)", README.read_text()).group(1)
    assert f"torch>={floor}" in project["dependencies"]


def test_every_figure_is_one_the_measuring_script_makes():
    spec = importlib.util.spec_from_file_location(
        "measure_readme_figures", ROOT / "scripts" / "measure_readme_figures.py"
    )
    measure = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(measure)
    figures = {}
    for page in measure.PAGES:
        text = page.read_text()
        found = measure.figures_in(text)
        assert not set(found) & set(figures), f"{page}: a figure quoted twice"
        assert text.count("<!-- fig:") == text.count("<!-- /fig -->") == len(found)
        figures.update(found)
    assert set(figures) == set(measure.KNOWN)
    assert (
        measure.about(4.6) == "about 5 s" and measure.about(42) == "about 40 s" and measure.about(150) == "about 2 min"
    )


def test_round_trip_claims(tmp_path):
    """docs/checkpoints.md: to-torch -> from-torch gives the state writer's file; byte-identical for one it wrote."""
    from ort_torch_compat.api import CheckpointState
    from ort_torch_compat.cli import main

    artifact = ROOT / "examples" / "artifacts" / "mlp_classifier" / "checkpoint"
    state_written = tmp_path / "state_written"
    CheckpointState.save_checkpoint(
        CheckpointState.load_checkpoint(artifact), state_written, include_optimizer_state=True
    )
    for source, identical in ((artifact, False), (state_written, True)):
        tensors, back = tmp_path / f"{source.name}.safetensors", tmp_path / f"{source.name}.back"
        assert main(["to-torch", str(source), str(tensors), "--optimizer"]) == 0
        assert main(["from-torch", str(tensors), str(source), str(back)]) == 0
        assert (back.read_bytes() == source.read_bytes()) is identical
        assert back.read_bytes() == state_written.read_bytes()
