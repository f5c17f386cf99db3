#!/usr/bin/env python
"""Measure every figure README.md quotes, and write them into it.

    python scripts/measure_readme_figures.py            # measure and print; README unchanged
    python scripts/measure_readme_figures.py --write    # measure and update README.md
    python scripts/measure_readme_figures.py --write --skip-benchmark   # the quick figures only

README marks each figure as `<!-- fig:NAME -->value<!-- /fig -->`; this script knows how to
measure every NAME, so a figure in README is always one it produced on the code it ran:

- example_time: wall time of `python examples/train_classifier.py` (fresh process);
- suite_time: wall time of `python -m pytest -q` and the number of CPU cores;
- benchmark_table / benchmark_machine / benchmark_verdict: `scripts/benchmark.py` (needs
  onnxruntime-training 1.19.2; minutes), its table, the machine it ran on, and whether the
  targets README states were met.

Run it on a quiet machine: other processes inflate every number here.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import re
import subprocess
import sys
import tempfile
import time
from typing import Dict

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
FIGURE = re.compile(r"<!-- fig:(?P<name>[a-z_]+) -->(?P<value>.*?)<!-- /fig -->", re.S)
TODO = re.compile(r"^<!-- TODO\(lead\): the figures marked fig:NAME.*?-->\n\n?", re.M)
QUICK = ("example_time", "suite_time")
BENCHMARK = ("benchmark_table", "benchmark_machine", "benchmark_verdict")
KNOWN = QUICK + BENCHMARK


def _environment() -> Dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def _timed(command, cwd: pathlib.Path) -> float:
    start = time.perf_counter()
    subprocess.run(command, cwd=cwd, env=_environment(), check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def about(seconds: float) -> str:
    """'about 5 s', 'about 40 s', 'about 3 min': the precision a reader can use."""
    if seconds < 10:
        return f"about {max(1, round(seconds))} s"
    if seconds < 100:
        return f"about {round(seconds / 5) * 5} s"
    return f"about {round(seconds / 60)} min"


def measure_quick() -> Dict[str, str]:
    with tempfile.TemporaryDirectory() as out:
        example = _timed([sys.executable, "examples/train_classifier.py", "--out", out], ROOT)
    suite = _timed([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], ROOT)
    return {"example_time": about(example), "suite_time": f"{about(suite)} on {os.cpu_count()} CPU cores"}


def _machine(record: dict) -> str:
    cpu = platform.processor() or "CPU"
    flags = ""
    try:
        info = pathlib.Path("/proc/cpuinfo").read_text()
        cpu = re.search(r"^model name\s*:\s*(.+)$", info, re.M).group(1).strip()
        flags = " with AVX-512" if re.search(r"^flags\s*:.*\bavx512f\b", info, re.M) else ""
        memory = int(re.search(r"^MemTotal:\s*(\d+)", pathlib.Path("/proc/meminfo").read_text(), re.M).group(1))
        memory_text = f", {round(memory / 2**20)} GiB"
    except (OSError, AttributeError):
        memory_text = ""
    machine = record["machine"]
    return (f"{machine['cpus']}-core {cpu}{flags}{memory_text}, torch {machine['torch'].split('+')[0]} "
            f"{machine['device'].upper()} threads={machine['torch_threads']}")


def _verdict(summary: dict) -> str:
    """The README's targets: step <= 1.0x ORT and <= 1.15x eager, setup <= 2 s, peak RSS <= 1.2x ORT."""
    missed = []
    for model, rows in summary.items():
        ours, ort, eager = rows.get("ours", {}), rows.get("ort", {}), rows.get("eager", {})
        if "step_ms" not in ours:
            missed.append(f"{model}: no result")
            continue
        if "step_ms" in ort and ours["step_ms"] > ort["step_ms"]:
            missed.append(f"{model} step {ours['step_ms'] / ort['step_ms']:.2f}x ORT")
        if "step_ms" in eager and ours["step_ms"] > 1.15 * eager["step_ms"]:
            missed.append(f"{model} step {ours['step_ms'] / eager['step_ms']:.2f}x eager")
        if ours["setup_s"] > 2.0:
            missed.append(f"{model} setup {ours['setup_s']:.2f} s")
        if "peak_rss_mb" in ort and ours["peak_rss_mb"] > 1.2 * ort["peak_rss_mb"]:
            missed.append(f"{model} peak RSS {ours['peak_rss_mb'] / ort['peak_rss_mb']:.2f}x ORT")
    return "all met" if not missed else "not met (" + "; ".join(missed) + ")"


def measure_benchmark() -> Dict[str, str]:
    with tempfile.TemporaryDirectory() as work:
        record_path = pathlib.Path(work) / "benchmark.json"
        subprocess.run([sys.executable, "scripts/benchmark.py", "--json", str(record_path)], cwd=ROOT,
                       env=_environment(), check=True, stdout=subprocess.DEVNULL)
        record = json.loads(record_path.read_text())
    return {"benchmark_table": f"\n```text\n{record['table']}\n```\n", "benchmark_machine": _machine(record),
            "benchmark_verdict": _verdict(record["summary"])}


def figures_in(text: str) -> Dict[str, str]:
    return {match.group("name"): match.group("value") for match in FIGURE.finditer(text)}


def write(text: str, figures: Dict[str, str], complete: bool) -> str:
    text = FIGURE.sub(lambda m: f"<!-- fig:{m['name']} -->{figures.get(m['name'], m['value'])}<!-- /fig -->", text)
    return TODO.sub("", text) if complete else text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="update README.md with the measured figures")
    parser.add_argument("--skip-benchmark", action="store_true", help="measure only the quick figures")
    args = parser.parse_args()
    text = README.read_text()
    unknown = sorted(set(figures_in(text)) - set(KNOWN))
    if unknown:
        sys.exit(f"README.md has figures this script cannot measure: {unknown}")
    figures = measure_quick()
    if not args.skip_benchmark:
        figures.update(measure_benchmark())
    for name, value in figures.items():
        print(f"{name}: {value.strip()}")
    if args.write:
        README.write_text(write(text, figures, complete=not args.skip_benchmark))
        print(f"updated {README}")


if __name__ == "__main__":
    main()
