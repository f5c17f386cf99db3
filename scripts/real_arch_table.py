"""The real-architecture table of docs/parity.md, from what scripts/make_real_arch_reference.py recorded
(``tests/fixtures/real_arch/summary.json``) and, optionally, a scripts/benchmark.py JSON.

Parity is the verdict of the rule in ort_torch_compat/testing/parity_rule.py at recording time (the tests
re-check it on every run).  Step times come only from a benchmark JSON (``--benchmark``), its
idle-machine medians, on the row of the configuration the benchmark makes (opset 17, train
export, frozen running stats, AdamW); cells stay "-" otherwise (timings taken during a test
run on a loaded machine mean nothing).

    python scripts/real_arch_table.py [--summary tests/fixtures/real_arch/summary.json]
        [--benchmark bench.json] [--readme docs/parity.md]

With ``--readme PAGE`` the table replaces the lines between the two markers
``<!-- real-arch-table -->`` and ``<!-- /real-arch-table -->``.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
from typing import Any, Dict, List, Optional

ROOT = pathlib.Path(__file__).resolve().parent.parent
START, END = "<!-- real-arch-table -->", "<!-- /real-arch-table -->"
ANCHORS = {"ort": "ORT", "ort_dealiased": "ORT, de-aliased BN stats", "eager_float64": "float64 eager torch"}


def _step_times(benchmark: Optional[Dict[str, Any]], row: Dict[str, Any]) -> List[str]:
    """The idle-machine step times of the benchmark's configuration of this recipe (opset 17,
    train-mode export, running stats frozen, AdamW; at the recipe's "bench" size): only that
    row gets them."""
    benchmark_row = (row["opset"], row["export"], row["stats"], row["optimizer"]) == (17, "train", "frozen", "adamw")
    idle = (benchmark or {}).get("summary", {}).get("0", {})
    if not benchmark_row or row["recipe"] not in idle:
        return ["-", "-", "-"]
    ours = idle[row["recipe"]].get("ours", {}).get("step_ms")
    ort = idle[row["recipe"]].get("ort", {}).get("step_ms")
    ratio = f"{ours / ort:.2f}" if ours and ort else "-"
    return [f"{ours:.1f}" if ours else "-", f"{ort:.1f}" if ort else "-", ratio]


def _parity(row: Dict[str, Any]) -> str:
    if not row.get("ok"):
        return f"not recorded ({row.get('stage')})"
    verdict = row["verdict"]
    if verdict["parity"] != "pass":
        return "**FAIL**"
    if verdict["rule"] == "elementwise":
        return "pass, every step elementwise"
    return (
        f"pass, step 1 elementwise + trajectory ({verdict['trajectory_ours']:.0f} <= {verdict['trajectory_bound']:.0f})"
    )


def table(summary: Dict[str, Any], benchmark: Optional[Dict[str, Any]] = None) -> str:
    lines = [
        "| model | opset | export | BN running stats | optimizer | anchor | parity | step ms (ours) | "
        "step ms (ORT) | ours / ORT |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    rows = [r for name, r in sorted(summary.items()) if not name.startswith("_")]
    rows.sort(key=lambda r: (r["recipe"], r["opset"], r["export"], r["stats"], r["optimizer"]))
    for row in rows:
        stats = {"frozen": "frozen params", "initializer": "initializers"}[row["stats"]]
        cells = [
            row["recipe"],
            str(row["opset"]),
            row["export"],
            stats,
            row["optimizer"],
            ANCHORS.get(row.get("anchor"), "-"),
            _parity(row),
            *_step_times(benchmark, row),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--summary", type=pathlib.Path, default=ROOT / "tests" / "fixtures" / "real_arch" / "summary.json"
    )
    parser.add_argument("--benchmark", type=pathlib.Path)
    parser.add_argument("--readme", type=pathlib.Path)
    args = parser.parse_args(argv)
    summary = json.loads(args.summary.read_text())
    benchmark = json.loads(args.benchmark.read_text()) if args.benchmark else None
    text = table(summary, benchmark)
    if args.readme is None:
        print(text)
        return 0
    readme = args.readme.read_text()
    if START not in readme or END not in readme:
        print(f"{args.readme}: markers {START} / {END} not found", file=sys.stderr)
        return 1
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    args.readme.write_text(f"{head}{START}\n{text}\n{END}{tail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
