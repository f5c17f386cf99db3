"""Architecture sweep: models the project did not design (ort_torch_compat/testing/sweep_models.py: torchvision
and Hugging Face transformers architectures at tiny sizes), each exported with the TorchScript
exporter (``dynamo=False``, opset 17) and the dynamo exporter (``dynamo=True``, opset 18, its
default; ``dyn17`` asks it for opset 17), made into training artifacts (AdamW,
CrossEntropyLoss) with ONNX Runtime's ``generate_artifacts`` where ORT can and with ours
always, trained 3 steps in onnxruntime-training and in ort_torch_compat on the same batches,
with a float64 eager-PyTorch run of the same 3 AdamW steps as the referee.

Per (architecture, exporter) it records the losses of 4 forward passes (before each of the 3
steps and after the last) for:

* ``ort``: ORT's artifacts trained by ORT;
* ``ours``: our generate_artifacts' artifacts trained by ort_torch_compat;
* ``ours_on_ort``: ORT's artifacts trained by ort_torch_compat (tells generator from runtime);
* ``ref``: the torch model in float64, the same 3 steps of ORT's AdamW (adam_mode 1, eps 1e-6,
  no weight decay, lr 1e-3), the same parameters trainable.

and classifies it (``classify``):

* ``MATCH``: ORT and ours agree (every loss within 1e-4 * max(1, |loss|)), or both are within
  4x of what float32 rounding alone does (eager torch in float32, and the float64 run from
  parameters moved by half a float32 ulp, against the float64 referee: ill-conditioned models,
  noted in ``why``);
* ``ORT-OFF`` / ``OURS-OFF``: they do not; the one farther from the float64 referee is off;
* ``ORT-FAIL``: ORT cannot make or train the artifacts (the stage and ORT's message are kept)
  while ours trains and agrees with the referee (within 1e-3 * max(1, |loss|));
* ``OURS-FAIL``: our generator (for another reason than a missing gradient) or runtime fails;
* ``REFUSED-BY-OUR-GENERATOR``: our generate_artifacts names ops it has no gradient for;
* ``EXPORT-FAIL``: the torch exporter itself fails (nobody's artifacts to compare).

Usage::

    python scripts/architecture_sweep.py --all --out results.json     # everything (~1 h on 2 cores)
    python scripts/architecture_sweep.py --archs hf_bert,tv_resnet18 --exporters ts17,dyn18 --out r.json
    python scripts/architecture_sweep.py --table results.json      # counts and the per-case table (markdown)
    # rerun only the cases of one class of a results file, merged into --out (may be the same file);
    # --follow-dyn17: then dyn17 for every rerun dyn18 case that now trains and has no dyn17 record
    python scripts/architecture_sweep.py --cases-from docs/architecture-sweep.json \
        --class REFUSED-BY-OUR-GENERATOR --follow-dyn17 --out docs/architecture-sweep.json

Cases run one after the other in a subprocess, with one thread (a crash or a hang in one runtime
is recorded, not fatal: the rest go on in a new process); ``--out`` is rewritten after every case, and cases already in it are skipped
unless ``--redo``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Dict, List

from ort_torch_compat.testing import architecture_sweep as sweep
from ort_torch_compat.testing import sweep_models


def _one(arch: str, exporter: str) -> Dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"sweep_{arch}_{exporter}_") as tmp:
        try:
            return sweep.run_case(arch, exporter, pathlib.Path(tmp))
        except Exception as error:  # noqa: BLE001
            return {
                "arch": arch,
                "exporter": exporter,
                "class": "EXPORT-FAIL",
                "why": "sweep harness: " + sweep.short_error(error),
                "stages": {"harness": traceback.format_exc()[-3000:]},
            }


def _child(journal: str, cases: str) -> int:
    """Run cases one after the other in this process (imports paid once), appending to the
    journal a ``started`` line before each case and its record after it."""
    with open(journal, "a") as handle:
        for item in cases.split(","):
            arch, exporter = item.split(":")
            handle.write(json.dumps({"started": item}) + "\n")
            handle.flush()
            start = time.perf_counter()
            record = _one(arch, exporter)
            record["wall_s"] = round(time.perf_counter() - start, 1)
            handle.write(json.dumps(record, default=float) + "\n")
            handle.flush()
    return 0


def run_in_subprocesses(cases: List[tuple], timeout: float):
    """Yield one record per (arch, exporter), running them in as few processes as possible: a
    case that crashes its process or runs over ``timeout`` seconds is recorded as such and the
    rest go on in a new process."""
    # 4 forwards: background compilation (ORT_TORCH_COMPAT_COMPILE=auto) would only cost CPU
    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        TRANSFORMERS_VERBOSITY="error",
    )
    env.setdefault("ORT_TORCH_COMPAT_COMPILE", "eager")
    pending = [f"{a}:{e}" for a, e in cases]
    while pending:
        with tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False) as handle:
            journal = handle.name
        errors = tempfile.TemporaryFile(mode="w+")  # the exporters are chatty: a pipe would fill up
        proc = subprocess.Popen(
            [sys.executable, str(pathlib.Path(__file__).resolve()), "--child", journal, ",".join(pending)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=errors,
            text=True,
        )
        seen = 0
        current, since = None, time.perf_counter()
        failure = None
        while True:
            lines = pathlib.Path(journal).read_text().splitlines()
            complete = [line for line in lines if line.endswith("}")]
            for line in complete[seen:]:
                entry = json.loads(line)
                if "started" in entry:
                    current, since = entry["started"], time.perf_counter()
                else:
                    pending.remove(f"{entry['arch']}:{entry['exporter']}")
                    current = None
                    yield entry
            seen = len(complete)
            if proc.poll() is not None:
                if current is not None:
                    errors.seek(0)
                    failure = {
                        "class": "OURS-FAIL",
                        "why": f"case process died (rc {proc.returncode}): " + errors.read()[-300:].replace("\n", " "),
                    }
                break
            if current is not None and time.perf_counter() - since > timeout:
                proc.kill()
                proc.wait()
                failure = {"class": "TIMEOUT", "why": f"over {timeout:.0f} s"}
                break
            time.sleep(1.0)
        os.unlink(journal)
        errors.close()
        if failure is not None and current is not None:
            arch, exporter = current.split(":")
            pending.remove(current)
            yield dict(failure, arch=arch, exporter=exporter, stages={}, wall_s=round(time.perf_counter() - since, 1))


# ---------------------------------------------------------------- reports
def table(results: List[Dict[str, Any]]) -> str:
    def fmt(x):
        return "—" if x is None else f"{x:.1e}"

    lines = [
        "| architecture | exporter | class | ORT dev | ours dev | ours on ORT's artifacts dev | why |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in sorted(results, key=lambda r: (r["arch"], r["exporter"])):
        dev = r.get("deviation") or {}
        why = (r.get("why") or "").replace("|", "\\|")
        lines.append(
            f"| {r['arch']} | {r['exporter']} | {r['class']} | {fmt(dev.get('ort'))} | {fmt(dev.get('ours'))} "
            f"| {fmt(dev.get('ours_on_ort'))} | {why[:220]} |"
        )
    return "\n".join(lines)


def summary(results: List[Dict[str, Any]]) -> str:
    """Counts per class and exporter, as a markdown table."""
    exporters = [e for e in sweep.EXPORTERS if any(r["exporter"] == e for r in results)]
    classes = [c for c in sweep.CLASSES + ("TIMEOUT",) if any(r["class"] == c for r in results)]
    lines = ["| class | " + " | ".join(exporters) + " | all |", "|---|" + "---|" * (len(exporters) + 1)]
    for c in classes:
        row = [sum(1 for r in results if r["class"] == c and r["exporter"] == e) for e in exporters]
        lines.append(f"| {c} | " + " | ".join(map(str, row)) + f" | {sum(row)} |")
    totals = [sum(1 for r in results if r["exporter"] == e) for e in exporters]
    lines.append("| cases | " + " | ".join(map(str, totals)) + f" | {sum(totals)} |")
    archs = len({r["arch"] for r in results})
    return f"{archs} architectures, {len(results)} (architecture, exporter) cases.\n\n" + "\n".join(lines)


def counts(results: List[Dict[str, Any]]) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for r in results:
        out[r["class"]] = out.get(r["class"], 0) + 1
    return dict(sorted(out.items()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--all", action="store_true", help="every architecture in ort_torch_compat/testing/sweep_models.py"
    )
    parser.add_argument("--archs", default="", help="comma-separated architecture names")
    parser.add_argument(
        "--exporters", default=",".join(sweep.DEFAULT_EXPORTERS), help=f"comma-separated, of {sweep.EXPORTERS}"
    )
    parser.add_argument("--out", default="architecture_sweep.json")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per case")
    parser.add_argument("--redo", action="store_true", help="rerun cases already in --out")
    parser.add_argument("--table", metavar="RESULTS", help="print the markdown table of a results file and exit")
    parser.add_argument("--list", action="store_true")
    parser.add_argument(
        "--cases-from",
        metavar="RESULTS",
        help="rerun the (architecture, exporter) cases of this results file (with --class: of those "
        "classes only) instead of --all/--archs x --exporters; always reruns them",
    )
    parser.add_argument(
        "--class",
        dest="classes",
        default="",
        help=f"comma-separated classes for --cases-from, of {sweep.CLASSES + ('TIMEOUT',)}",
    )
    parser.add_argument(
        "--follow-dyn17",
        action="store_true",
        help="afterwards run dyn17 for every architecture whose dyn18 case was run here and now "
        "trains (ours generates and trains it) and that has no dyn17 record",
    )
    parser.add_argument(
        "--reclassify",
        metavar="RESULTS",
        help="recompute class and why of every record of a results file from its stored stages "
        "(after a change to classify) and rewrite it",
    )
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return _child(*args.child)
    if args.list:
        print("\n".join(sweep_models.ARCHS))
        return 0
    if args.reclassify:
        path = pathlib.Path(args.reclassify)
        results = json.loads(path.read_text())
        for r in results:
            if "deviation" in r or "export" in r.get("stages", {}) or "ours_generate" in r.get("stages", {}):
                r.update(sweep.classify(r))
        path.write_text(json.dumps(results, indent=1, default=float))
        print(json.dumps(counts(results)))
        return 0
    if args.table:
        results = json.loads(pathlib.Path(args.table).read_text())
        print(summary(results))
        print()
        print(table(results))
        return 0
    out = pathlib.Path(args.out)
    results = json.loads(out.read_text()) if out.exists() else []
    if args.cases_from:
        wanted = {c for c in args.classes.split(",") if c}
        unknown = wanted - set(sweep.CLASSES + ("TIMEOUT",))
        if unknown:
            parser.error(f"unknown classes {sorted(unknown)}")
        source = json.loads(pathlib.Path(args.cases_from).read_text())
        todo = [(r["arch"], r["exporter"]) for r in source if not wanted or r["class"] in wanted]
        unknown = sorted({a for a, _ in todo if a not in sweep_models.ARCHS})
        if unknown:
            parser.error(f"unknown architectures {unknown}")
    else:
        archs = list(sweep_models.ARCHS) if args.all else [a for a in args.archs.split(",") if a]
        unknown = [a for a in archs if a not in sweep_models.ARCHS]
        if unknown or not archs:
            parser.error(f"unknown architectures {unknown}" if unknown else "give --all, --archs or --cases-from")
        exporters = [e for e in args.exporters.split(",") if e]
        done = {(r["arch"], r["exporter"]) for r in results}
        todo = [(a, e) for a in archs for e in exporters if args.redo or (a, e) not in done]

    def run(cases):
        nonlocal results
        ran = []
        for record in run_in_subprocesses(cases, args.timeout):
            arch, exporter = record["arch"], record["exporter"]
            results = [r for r in results if (r["arch"], r["exporter"]) != (arch, exporter)] + [record]
            out.write_text(json.dumps(results, indent=1, default=float))
            ran.append(record)
            print(
                f"{arch:28s} {exporter:6s} {record['class']:26s} {record.get('wall_s', 0):6.1f}s "
                f"{(record.get('why') or '')[:150]}",
                flush=True,
            )
        return ran

    ran = run(todo)
    if args.follow_dyn17:
        not_training = ("REFUSED-BY-OUR-GENERATOR", "EXPORT-FAIL", "OURS-FAIL", "TIMEOUT")
        have17 = {r["arch"] for r in results if r["exporter"] == "dyn17"}
        run(
            [
                (r["arch"], "dyn17")
                for r in ran
                if r["exporter"] == "dyn18" and r["class"] not in not_training and r["arch"] not in have17
            ]
        )
    print(json.dumps(counts(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
