"""The benchmark's report as text: the result tables and the measuring conditions.

``scripts/benchmark.py`` prints them and ``scripts/measure_readme_figures.py`` writes them into
README.md and docs/performance.md, from the JSON report ``benchmark.py --json`` records.
"""

from __future__ import annotations

from typing import Optional, Sequence

from . import step_accounting
from .step_accounting import StepClock


def table(report: dict, markdown: bool = False) -> str:
    """The result table (plain text for the console, markdown for README)."""
    columns = [
        "load",
        "model",
        "backend",
        "step ms",
        "cpu ms",
        "vs ort",
        "vs eager",
        "vs compile",
        "setup s",
        "first step ms",
        "compile s",
        "import s",
        "peak RSS MB",
    ]
    rows = []
    for load, models in report["summary"].items():
        for name, backends in models.items():
            for backend, row in backends.items():
                if "error" in row:
                    rows.append([load, name, backend, "error: " + row["error"][:80]] + [""] * (len(columns) - 4))
                    continue
                ratios = []
                for ref in ("ort", "eager", "compile"):
                    ref_row = backends.get(ref, {})
                    ratios.append(f"{row['step_ms'] / ref_row['step_ms']:.2f}" if "step_ms" in ref_row else "-")
                compile_s = report.get("compile", {}).get(name, {}).get("compile_s")
                label = backend
                forms = sorted(set(row.get("step_forms", [])) - {"compiled"})
                if backend == "ours" and "cuda_graphs" in row:
                    label += " (CUDA graphs)" if row["cuda_graphs"] else " (eager)"
                elif forms and backend.startswith("ours"):  # not compiled in some round: how it ran
                    label += " [" + ", ".join(forms) + "]"
                elif backend == "ours" and not row.get("compiled", True) and report["machine"]["device"] == "cpu":
                    label += " (eager)"  # a report from before step forms were recorded
                rows.append(
                    [
                        load,
                        name,
                        label,
                        f"{row['step_ms']:.2f}",
                        f"{row['cpu_ms']:.2f}",
                        *ratios,
                        f"{row['setup_s']:.2f}",
                        f"{row['first_ms']:.0f}",
                        f"{compile_s:.0f}" if backend == "ours" and compile_s else "",
                        f"{row['import_s']:.2f}",
                        f"{row['peak_rss_mb']:.0f}",
                    ]
                )
    return _render(columns, rows, markdown)


def _render(columns: list, rows: list, markdown: bool) -> str:
    """A markdown table, or right-aligned plain columns for the console."""
    if markdown:
        lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])
    widths = [max(len(str(c)) for c in [col] + [r[i] for r in rows]) for i, col in enumerate(columns)]
    lines = ["  ".join(str(c).rjust(w) for c, w in zip(columns, widths))]
    return "\n".join(lines + ["  ".join(str(c).rjust(w) for c, w in zip(row, widths)) for row in rows])


LOCAL_STEPS = 100  # the steps whose median a step is compared with in the local count (see window_statistics)


def _over_twice_the_local_median(times: Sequence[float]) -> list:
    """Indices of the steps after the first that took over twice the median of their block
    of LOCAL_STEPS consecutive steps (blocks from the second step on)."""
    over = []
    for start in range(1, len(times), LOCAL_STEPS):
        block = times[start : start + LOCAL_STEPS]
        median = sorted(block)[len(block) // 2]
        over.extend(start + offset for offset, seconds in enumerate(block) if seconds > 2 * median)
    return over


def window_statistics(times: Sequence[float], switch: Optional[int], clock: Optional[StepClock] = None) -> dict:
    """The first-seconds axis of one process from its step times (seconds, in order) and the
    1-based step at which the compiled step took over (None: it did not).

    The median and the count of steps over twice it are taken after the first step, as the
    issue's "no step over 2x the median" reads; the steps before the switch (the traced
    steps that run while the compiler works in the background) get their own median, and
    the steps over twice the whole run's median are counted separately from the switch on,
    so a steady, slower traced phase and a stall of the loop read apart.  `over_2x_local_median`
    counts the steps over twice the median of their own LOCAL_STEPS consecutive steps: a
    step much longer than its neighbours, whatever the phase (the traced steps are no
    longer than their neighbours; a collection, a wait for a lock or a core is).  With the `clock`
    that timed the steps (step_accounting.py), also how many of the steps over twice the
    median spent most of their time on each cause (`over_2x_median_running`, `_queued`,
    `_blocked`, `_other`; the same from the switch on and for the local count), and the parts of the longest step
    (`max_running_ms`, `max_queued_ms`, `max_rest_ms`, `max_switches`)."""
    later = sorted(times[1:]) or [0.0]
    median = later[len(later) // 2]
    longest = max(range(1, len(times)), key=times.__getitem__, default=0)
    before = sorted(times[1 : switch - 1]) if switch else []
    over = [index for index in range(1, len(times)) if times[index] > 2 * median]
    from_switch = None if switch is None else [index for index in over if index >= switch - 1]
    local = _over_twice_the_local_median(times)
    statistics = {
        "steps": len(times),
        "median_ms": 1000 * median,
        "max_ms": 1000 * later[-1],
        "max_step": longest + 1,  # 1-based, as switch_step
        "switch_step": switch,
        "switch_ms": None if switch is None else 1000 * times[switch - 1],
        "over_2x_median": len(over),
        "before_switch_median_ms": 1000 * before[len(before) // 2] if before else None,
        "over_2x_median_from_switch": None if from_switch is None else len(from_switch),
        "over_2x_local_median": len(local),
    }
    if clock is not None and clock.accounted and len(times) > 1:  # flat numbers: the rounds' medians are taken
        for cause, count in step_accounting.causes(clock, over).items():
            statistics[f"over_2x_median_{cause}"] = count
        if from_switch is not None:
            for cause, count in step_accounting.causes(clock, from_switch).items():
                statistics[f"over_2x_median_from_switch_{cause}"] = count
        for cause, count in step_accounting.causes(clock, local).items():
            statistics[f"over_2x_local_median_{cause}"] = count
        for part, value in step_accounting.parts(clock, longest).items():
            statistics[f"max_{part}"] = value
    return statistics


def fresh_table(report: dict, markdown: bool = False) -> str:
    """The first-seconds axis: steps in the first S seconds of a fresh process, cold cache."""
    columns = [
        "load",
        "model",
        "backend",
        f"steps in {report['fresh_seconds']:.0f} s"
        + (" (first on machine)" if report.get("fresh_first_on_machine") else ""),
        "vs ort",
        "vs ort per round",
        "ready s",
        "median step ms",
        "longest step ms",
        "steps > 2x median",
        "compiled from step",
        "compiled from s",
        "switch step ms",
        "median before switch ms",
        "> 2x median from switch",
        "> 2x median: running / queued / blocked / other",
        "of those, from switch",
        f"> 2x the median of its {LOCAL_STEPS} steps",
        "of those: running / queued / blocked / other",
        "longest: running / queued / rest ms",
    ]
    rows = []
    for load, models in report["fresh_summary"].items():
        for name, backends in models.items():
            for backend, row in backends.items():
                if "error" in row:
                    rows.append([load, name, backend, "error: " + row["error"][:80]] + [""] * (len(columns) - 4))
                    continue
                ort = backends.get("ort", {})
                rows.append(
                    [
                        load,
                        name,
                        backend,
                        f"{row['steps']:.0f}",
                        f"{row['steps'] / ort['steps']:.2f}" if ort.get("steps") else "-",
                        _ratios_per_round(report, load, name, backend),
                        f"{row['ready_s']:.1f}",
                        f"{row['median_ms']:.2f}",
                        f"{row['max_ms']:.1f}",
                        _optional(row, "over_2x_median", "{:.0f}"),
                        _optional(row, "switch_step", "{:.0f}"),
                        _optional(row, "switch_s", "{:.1f}"),
                        _optional(row, "switch_ms", "{:.1f}"),
                        _optional(row, "before_switch_median_ms", "{:.2f}"),
                        _optional(row, "over_2x_median_from_switch", "{:.0f}"),
                        _joined(row, [f"over_2x_median_{cause}" for cause in step_accounting.CAUSES], "{:.0f}"),
                        _joined(
                            row, [f"over_2x_median_from_switch_{cause}" for cause in step_accounting.CAUSES], "{:.0f}"
                        ),
                        _optional(row, "over_2x_local_median", "{:.0f}"),
                        _joined(row, [f"over_2x_local_median_{cause}" for cause in step_accounting.CAUSES], "{:.0f}"),
                        _joined(row, ["max_running_ms", "max_queued_ms", "max_rest_ms"], "{:.1f}"),
                    ]
                )
    return _render(columns, rows, markdown)


def _ratios_per_round(report: dict, load: str, name: str, backend: str) -> str:
    """The backend's step count over ORT's, round by round ("1.05 / 1.06 / 0.96"; "-" for ORT
    itself and for reports without the rounds): the rounds are interleaved, and on a noisy host
    one fresh process per side is a sample of about 5-10% (docs/performance.md, "A third host
    kind"), which the median over rounds hides."""
    raw = report.get("fresh_raw", {}).get(load, {}).get(name, {})
    if backend == "ort":
        return "-"
    pairs = zip(raw.get("ort", []), raw.get(backend, []))
    ratios = [f"{run['steps'] / base['steps']:.2f}" for base, run in pairs if base.get("steps") and "steps" in run]
    return " / ".join(ratios) or "-"


def _optional(row: dict, key: str, form: str) -> str:
    """A cell that reports made before its column, or rows without a switch, leave empty."""
    return form.format(row[key]) if row.get(key) is not None else "-"


def _joined(row: dict, keys: list, form: str) -> str:
    """Cells of one kind in one column ("a / b / c"), or "-" where the report lacks them."""
    if any(row.get(key) is None for key in keys):
        return "-"
    return " / ".join(form.format(row[key]) for key in keys)


def conditions(report: dict) -> str:
    machine = report["machine"]
    device = machine["device"] + (f" ({machine['gpu']})" if machine.get("gpu") else "")
    return (
        f"{machine['cpus']} CPUs ({machine['processor'] or machine['platform']}"
        + (f"; {machine['cpu']}" if machine.get("cpu") else "")
        + f"), torch {machine['torch']}, "
        f"threads {machine['threads'] or 'default'}, device {device}, size {report.get('size', 'bench')}; "
        f"{report['rounds']} interleaved "
        f"rounds of {report['steps']} steps after {report['warmup']} warm-up steps, medians; load = number of "
        "busy background processes"
    )
