#!/usr/bin/env python
"""Measure every figure README.md and docs/performance.md quote, and write them into them.

    python scripts/measure_readme_figures.py            # measure and print; the pages unchanged
    python scripts/measure_readme_figures.py --write    # measure and update README.md and docs/performance.md
    python scripts/measure_readme_figures.py --write --skip-benchmark   # the quick figures only

The pages mark each figure as `<!-- fig:NAME -->value<!-- /fig -->`; this script knows how to
measure every NAME, so a figure in them is always one it produced on the code it ran (README
quotes the quick ones, docs/performance.md the benchmark's):

- example_time: wall time of `python examples/train_classifier.py` (fresh process);
- suite_time: wall time of `python -m pytest -q` and the number of CPU cores;
- benchmark_table / benchmark_machine / benchmark_verdict: `scripts/benchmark.py --background 0 2`
  (needs onnxruntime-training 1.19.2 and the `zoo` extra; hours on 2 cores), or a report it
  wrote (`--benchmark-json`): its table, the conditions it ran under, and whether the targets
  README states were met.

Run it on a quiet machine: other processes inflate every number here.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time
from typing import Dict

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = (README, ROOT / "docs" / "performance.md")
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


def _verdict(report: dict) -> str:
    """Issue 13's targets, at every load level: step <= 1.0x ORT, setup <= 2 s (warm compile
    cache), peak RSS <= 1.2x ORT."""
    missed = []
    for load, models in report["summary"].items():
        for model, rows in models.items():
            ours, ort = rows.get("ours", {}), rows.get("ort", {})
            where = f"{model} at load {load}"
            if "step_ms" not in ours:
                missed.append(f"{where}: no result")
                continue
            if "step_ms" in ort and ours["step_ms"] > ort["step_ms"]:
                missed.append(f"{where}: step {ours['step_ms'] / ort['step_ms']:.2f}x ORT")
            if ours["setup_s"] > 2.0:
                missed.append(f"{where}: setup {ours['setup_s']:.2f} s")
            if "peak_rss_mb" in ort and ours["peak_rss_mb"] > 1.2 * ort["peak_rss_mb"]:
                missed.append(f"{where}: peak RSS {ours['peak_rss_mb'] / ort['peak_rss_mb']:.2f}x ORT")
    return "all met" if not missed else "not met: " + "; ".join(missed)


def benchmark_figures(report: dict) -> Dict[str, str]:
    from ort_torch_compat.testing.benchmark_report import conditions, table

    return {
        "benchmark_table": "\n" + table(report, markdown=True) + "\n",
        "benchmark_machine": conditions(report),
        "benchmark_verdict": _verdict(report),
    }


def measure_benchmark() -> dict:
    with tempfile.TemporaryDirectory() as work:
        record_path = pathlib.Path(work) / "benchmark.json"
        subprocess.run(
            [sys.executable, "scripts/benchmark.py", "--background", "0", "2", "--json", str(record_path)],
            cwd=ROOT,
            env=_environment(),
            check=True,
            stdout=subprocess.DEVNULL,
        )
        return json.loads(record_path.read_text())


def figures_in(text: str) -> Dict[str, str]:
    return {match.group("name"): match.group("value") for match in FIGURE.finditer(text)}


def write(text: str, figures: Dict[str, str], complete: bool) -> str:
    text = FIGURE.sub(lambda m: f"<!-- fig:{m['name']} -->{figures.get(m['name'], m['value'])}<!-- /fig -->", text)
    return TODO.sub("", text) if complete else text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--write", action="store_true", help="update README.md and docs/performance.md with the measured figures"
    )
    parser.add_argument("--skip-benchmark", action="store_true", help="measure only the quick figures")
    parser.add_argument(
        "--benchmark-json",
        type=pathlib.Path,
        default=None,
        help="take the benchmark figures from this `scripts/benchmark.py --json` report",
    )
    parser.add_argument("--skip-quick", action="store_true", help="keep the example and test-suite times")
    args = parser.parse_args()
    texts = {page: page.read_text() for page in PAGES}
    for page, text in texts.items():
        unknown = sorted(set(figures_in(text)) - set(KNOWN))
        if unknown:
            sys.exit(f"{page} has figures this script cannot measure: {unknown}")
    figures = {} if args.skip_quick else measure_quick()
    if args.benchmark_json:
        figures.update(benchmark_figures(json.loads(args.benchmark_json.read_text())))
    elif not args.skip_benchmark:
        figures.update(benchmark_figures(measure_benchmark()))
    for name, value in figures.items():
        print(f"{name}: {value.strip()}")
    if args.write:
        for page, text in texts.items():
            page.write_text(write(text, figures, complete=not args.skip_benchmark))
            print(f"updated {page}")


if __name__ == "__main__":
    main()
