"""The project's real architectures (``real_arch_models.RECIPES``) exported with the dynamo
exporter (``dynamo=True, optimize=False``; opset 18, its default, and 17), made into artifacts by
ORT 1.19.2's ``generate_artifacts`` (where it is installed and can) and by ours, trained 3 AdamW
steps by ORT and by ort_torch_compat, against the float64 eager-PyTorch referee, and classified
as the architecture sweep classifies (``architecture_sweep.classify``).

It is the sweep's case (``architecture_sweep.run_case``) for the recipes: the same batches
(``architecture_sweep.batches``), the same referee, the same AdamW, the same tolerances; what
differs is the recipe's parameter split (frozen parameters and BatchNorm running stats go to
``frozen_params``, as ``real_arch_artifacts.split_parameters`` does for the fixtures) and its
loss (CrossEntropy, or MSE for the U-Net).  Besides the sweep's legs (``ort``: ORT's artifacts
in ORT; ``ours``: ours in ort_torch_compat; ``ours_on_ort``: ORT's artifacts in
ort_torch_compat) it trains ``ort_on_ours``: our artifacts in ORT (where ORT is installed),
which tells whether ORT's runtime agrees with our generator's graphs.

``scripts/real_arch_dynamo.py`` runs it over the recipes; ``tests/test_real_architectures_dynamo.py``
over three small ones.
"""

from __future__ import annotations

import pathlib
import time
import traceback
from typing import Any, Dict, List

from . import architecture_sweep as sweep
from . import real_arch_artifacts as arts
from . import real_arch_models as zoo
from . import sweep_models

EXPORTERS = {"dyn18": 18, "dyn17": 17}


def as_case(built: "zoo.Built") -> "sweep_models.Case":
    """The recipe's model and example inputs in the sweep's shape (the sweep's batches draw
    token ids below ``sweep_models.VOCAB``, 64, which every recipe's vocabulary exceeds)."""
    return sweep_models.Case(
        built.model,
        [(name, tensor) for name, tensor, *_ in built.inputs],
        built.classes,
        "ort_torch_compat/testing/real_arch_models.py",
    )


def targets(case, built: "zoo.Built", data, seed: int = 2):
    """Labels for the recipe's loss: class indices (CrossEntropy) or float32 targets shaped like
    the output (MSE), one per batch."""
    import numpy as np
    import torch

    with torch.no_grad():
        output = case.model(*[torch.from_numpy(x) for x in data[0]])
    if built.loss == "ce":
        return sweep.label_batches(int(output.shape[0]), built.classes, seed)
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(tuple(output.shape)).astype(np.float32) for _ in range(sweep.STEPS + 1)]


def run_recipe(
    name: str, exporter: str, workdir: pathlib.Path, size: str = "test", generators=("ort", "ours")
) -> Dict[str, Any]:
    """One (recipe, exporter) case: the sweep's record (``stages``, ``losses``, ``deviation``,
    ``class``, ``why``) plus ``ort_on_ours`` and the parameter split."""
    import torch

    torch.set_num_threads(1)
    record: Dict[str, Any] = {"arch": name, "exporter": exporter, "stages": {}, "seconds": {}}
    stages = record["stages"]
    recipe = zoo.RECIPES[name]
    built = recipe.build(size)
    case = as_case(built)
    record.update(source=recipe.note, classes=built.classes, loss=built.loss)
    opset = EXPORTERS[exporter]

    def timed(stage, fn):
        start = time.perf_counter()
        try:
            return fn()
        except Exception as error:  # noqa: BLE001 (recorded)
            stages[stage] = sweep.short_error(error)
            record.setdefault("tracebacks", {})[stage] = traceback.format_exc()[-3000:]
            return None
        finally:
            record["seconds"][stage] = round(time.perf_counter() - start, 2)

    model = timed("export", lambda: arts.export_onnx(built, opset, "train", "dynamo"))
    if model is None:
        record.update(sweep.classify(record))
        return record
    record["ops"] = sorted({f"{n.domain + '::' if n.domain else ''}{n.op_type}" for n in model.graph.node})
    trainable, frozen = arts.split_parameters(built, model, "frozen")
    params = dict(built.model.named_parameters(remove_duplicate=False))
    canonical = arts.canonical_parameter_names(built.model)
    expected = [n for n, p in built.model.named_parameters() if not built.frozen(n)]
    record.update(
        trainable=len(trainable),
        frozen=len(frozen),
        trainable_values=int(sum(params[n].numel() for n in trainable)),
        # torch parameters that should train but are no initializer of the graph by any
        # of their names (what the exporter's optimizer does with optimize=True)
        trainable_missing=sorted(set(expected) - {canonical[n] for n in trainable}),
    )
    if not trainable:
        stages["ours_generate"] = "no trainable torch parameter is an initializer of the exported model"
        record.update(sweep.classify(record))
        return record
    data = sweep.batches(case)
    labels = targets(case, built, data)
    start = {n: p.detach().double().numpy().copy() for n, p in built.model.named_parameters(remove_duplicate=False)}
    loss = built.loss
    runs: Dict[str, Any] = {}
    runs["ref"] = timed("referee", lambda: sweep.referee(case, trainable, data, labels, loss=loss))
    perturbed = timed("referee_perturbed", lambda: sweep.referee(case, trainable, data, labels, perturb=1, loss=loss))
    eager32 = timed("eager_float32", lambda: sweep.referee(case, trainable, data, labels, dtype="float32", loss=loss))
    from ort_torch_compat import api as ours_api

    try:
        from onnxruntime.training import api as ort_api
    except ImportError:
        ort_api = None
    ort_dir, our_dir = workdir / "ort", workdir / "ours"
    if ort_api is None or "ort" not in generators:
        stages["ort_generate"] = "onnxruntime-training is not installed" if ort_api is None else "not asked"
    elif (
        timed(
            "ort_generate",
            lambda: arts.artifacts_from_export(
                built, model, ort_dir, arts.Variant(opset, exporter="dynamo", generator="ort")
            ),
        )
        is not None
    ):
        runs["ort"] = timed("ort_train", lambda: sweep.train(ort_api, ort_dir, trainable, data, labels))
        runs["ours_on_ort"] = timed(
            "ours_on_ort_train", lambda: sweep.train(ours_api, ort_dir, trainable, data, labels)
        )
    if (
        timed(
            "ours_generate",
            lambda: arts.artifacts_from_export(
                built, model, our_dir, arts.Variant(opset, exporter="dynamo", generator="ours")
            ),
        )
        is not None
    ):
        runs["ours"] = timed("ours_train", lambda: sweep.train(ours_api, our_dir, trainable, data, labels))
        if ort_api is not None:
            runs["ort_on_ours"] = timed(
                "ort_on_ours_train", lambda: sweep.train(ort_api, our_dir, trainable, data, labels)
            )
    legs = ("ort", "ours", "ours_on_ort", "ort_on_ours")
    record["losses"] = {k: (v["losses"] if v else None) for k, v in runs.items()}
    ref = runs.get("ref")
    if ref:
        record["sensitivity"] = sweep.deviation(perturbed, ref)
        record["eager_float32_deviation"] = sweep.deviation(eager32, ref)
        record["deviation"] = {k: sweep.deviation(runs.get(k), ref) for k in legs}
        record["update_error"] = {k: sweep.update_error(runs.get(k), ref, start) for k in legs}
    else:
        record["deviation"] = {k: None for k in legs}
    if runs.get("ort") and runs.get("ours"):
        record["pair_deviation"] = sweep.pair_deviation(runs["ours"], runs["ort"])
    if runs.get("ort_on_ours") and runs.get("ours"):
        record["ort_on_ours_pair_deviation"] = sweep.pair_deviation(runs["ort_on_ours"], runs["ours"])
    if (
        ref is None
        and "ours_generate" not in stages
        and "ours_train" not in stages
        and runs.get("ort")
        and runs.get("ours")
    ):
        record.update(
            {
                "class": "MATCH" if record["pair_deviation"] <= sweep.PAIR_TOL else "OURS-OFF",
                "why": "no float64 referee: " + stages["referee"],
            }
        )
        return record
    record.update(sweep.classify(record))
    return annotate(record)


def annotate(record: Dict[str, Any]) -> Dict[str, Any]:
    """Add to ``why`` what ORT's runtime did with our generator's artifacts (``ort_on_ours``):
    where ORT's generator fails, that is still ORT's numbers for the model."""
    stages, why = record.get("stages", {}), record.get("why") or ""
    if "ORT on our artifacts" in why or "ours_generate" in stages or "ours_train" in stages:
        return record
    if "ort_on_ours_train" in stages:
        extra = "ORT on our artifacts fails: " + sweep.ort_reason(stages["ort_on_ours_train"])
    elif record.get("ort_on_ours_pair_deviation") is not None:
        extra = f"ORT on our artifacts: {record['ort_on_ours_pair_deviation']:.1g} from ours"
    else:
        return record
    record["why"] = f"{why}; {extra}" if why else extra
    return record


def summary_line(record: Dict[str, Any]) -> str:
    return f"{record['arch']:16s} {record['exporter']:6s} {record['class']:26s} {(record.get('why') or '')[:160]}"


def recipes() -> List[str]:
    return sorted(zoo.RECIPES)


# ---------------------------------------------------------------- the script (scripts/real_arch_dynamo.py)
def _child(name: str, exporter: str, out: str) -> int:
    import json
    import tempfile

    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"real_arch_{name}_{exporter}_") as tmp:
        try:
            record = run_recipe(name, exporter, pathlib.Path(tmp))
        except Exception as error:  # noqa: BLE001 (recorded)
            record = {
                "arch": name,
                "exporter": exporter,
                "class": "EXPORT-FAIL",
                "stages": {},
                "why": "harness: " + sweep.short_error(error),
                "tracebacks": {"harness": traceback.format_exc()},
            }
    record["wall_s"] = round(time.perf_counter() - start, 1)
    pathlib.Path(out).write_text(json.dumps(record, default=float))
    return 0


def run_in_subprocess(name: str, exporter: str, timeout: float) -> Dict[str, Any]:
    """One case in a child process with one thread (a crash or a hang is recorded, not fatal)."""
    import json
    import os
    import subprocess
    import sys
    import tempfile

    env = dict(
        os.environ,
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        TRANSFORMERS_VERBOSITY="error",
    )
    env.setdefault("ORT_TORCH_COMPAT_COMPILE", "eager")  # 4 forwards: compiling would only cost CPU
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "record.json"
        errors = pathlib.Path(tmp) / "stderr"
        start = time.perf_counter()
        with open(errors, "w") as handle:
            try:
                proc = subprocess.run(
                    [sys.executable, "-m", __name__, "--child", name, exporter, str(out)],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=handle,
                    timeout=timeout,
                )
            except subprocess.TimeoutExpired:
                return {
                    "arch": name,
                    "exporter": exporter,
                    "class": "TIMEOUT",
                    "why": f"over {timeout:.0f} s",
                    "stages": {},
                    "wall_s": round(time.perf_counter() - start, 1),
                }
        if out.exists():
            return json.loads(out.read_text())
        return {
            "arch": name,
            "exporter": exporter,
            "class": "OURS-FAIL",
            "stages": {},
            "why": f"case process died (rc {proc.returncode}): " + errors.read_text()[-300:].replace("\n", " "),
            "wall_s": round(time.perf_counter() - start, 1),
        }


def summary(results: List[Dict[str, Any]]) -> str:
    """Counts per class and exporter, as a markdown table."""
    exporters = [e for e in EXPORTERS if any(r["exporter"] == e for r in results)]
    classes = [c for c in sweep.CLASSES + ("TIMEOUT",) if any(r["class"] == c for r in results)]
    lines = ["| class | " + " | ".join(exporters) + " |", "|---|" + "---|" * len(exporters)]
    for c in classes:
        lines.append(
            f"| {c} | "
            + " | ".join(str(sum(1 for r in results if r["class"] == c and r["exporter"] == e)) for e in exporters)
            + " |"
        )
    lines.append(
        "| recipes | " + " | ".join(str(sum(1 for r in results if r["exporter"] == e)) for e in exporters) + " |"
    )
    return "\n".join(lines)


def table(results: List[Dict[str, Any]]) -> str:
    def fmt(x):
        return "—" if x is None else f"{x:.1e}"

    lines = [
        "| recipe | exporter | class | trainable (frozen) | ORT dev | ours dev | ours on ORT's artifacts dev "
        "| ORT on our artifacts dev | why |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in sorted(results, key=lambda r: (r["arch"], r["exporter"])):
        dev = r.get("deviation") or {}
        why = (r.get("why") or "").replace("|", "\\|")
        split = f"{r['trainable']} ({r.get('frozen', 0)})" if "trainable" in r else "—"
        lines.append(
            f"| {r['arch']} | {r['exporter']} | {r['class']} | {split} | {fmt(dev.get('ort'))} "
            f"| {fmt(dev.get('ours'))} | {fmt(dev.get('ours_on_ort'))} | {fmt(dev.get('ort_on_ours'))} "
            f"| {why[:260]} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    import argparse
    import json

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", default="", help="comma-separated (default: all 13)")
    parser.add_argument("--exporters", default="dyn18,dyn17", help=f"comma-separated, of {sorted(EXPORTERS)}")
    parser.add_argument("--out", default="real_arch_dynamo.json")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per case")
    parser.add_argument("--redo", action="store_true", help="rerun cases already in --out")
    parser.add_argument("--table", metavar="RESULTS", help="print the markdown table of a results file and exit")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return _child(*args.child)
    if args.table:
        results = json.loads(pathlib.Path(args.table).read_text())
        print(summary(results))
        print()
        print(table(results))
        return 0
    names = [n for n in args.recipes.split(",") if n] or recipes()
    unknown = [n for n in names if n not in zoo.RECIPES]
    exporters = [e for e in args.exporters.split(",") if e]
    if unknown or any(e not in EXPORTERS for e in exporters):
        parser.error(f"unknown recipes {unknown} or exporters {exporters}")
    out = pathlib.Path(args.out)
    results = json.loads(out.read_text()) if out.exists() else []
    done = {(r["arch"], r["exporter"]) for r in results}
    for exporter in exporters:
        for name in names:
            if (name, exporter) in done and not args.redo:
                continue
            record = run_in_subprocess(name, exporter, args.timeout)
            record.pop("tracebacks", None)  # long; the stages keep each failure's message
            results = [r for r in results if (r["arch"], r["exporter"]) != (name, exporter)] + [record]
            out.write_text(json.dumps(results, indent=1, default=float))
            print(summary_line(record), f"{record.get('wall_s', 0):.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
