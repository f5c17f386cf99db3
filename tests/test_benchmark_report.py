"""The benchmark report's text (ort_torch_compat/testing/benchmark_report.py): the tables that
docs/performance.md and README quote, and the measuring conditions that go with them."""

from __future__ import annotations

from ort_torch_compat.testing import benchmark_report

_ROW = {"step_ms": 0.2, "cpu_ms": 0.2, "setup_s": 0.1, "first_ms": 2.0, "import_s": 0.5, "peak_rss_mb": 600.0}


def _report(**machine) -> dict:
    machine = {
        "platform": "Linux-x",
        "processor": "",
        "cpus": 2,
        "torch": "2.14.1",
        "threads": 0,
        "device": "cpu",
    } | machine
    summary = {"0": {"lora": {"ort": dict(_ROW), "ours": dict(_ROW, step_ms=0.1, compiled=True)}}}
    return {"machine": machine, "size": "tiny", "rounds": 3, "steps": 1000, "warmup": 100, "summary": summary}


def test_conditions_name_the_cpu_where_the_report_has_it():
    assert "(Linux-x; Xeon, cache 1 KB)" in benchmark_report.conditions(_report(cpu="Xeon, cache 1 KB"))
    assert "2 CPUs (Linux-x), torch 2.14.1" in benchmark_report.conditions(_report())  # reports made before


def test_table_gives_ratios_to_ort():
    lines = benchmark_report.table(_report(), markdown=True).splitlines()
    assert lines[0].startswith("| load | model | backend | step ms |")
    assert lines[3].startswith("| 0 | lora | ours | 0.10 | 0.20 | 0.50 |")


def test_table_says_how_steps_ran_where_not_compiled():
    """`step_forms` (per round): a row not compiled in every round names the forms that ran."""
    report = _report()
    report["summary"]["0"]["lora"]["ours-off"] = dict(_ROW, step_ms=0.4, step_forms=["static", "traced", "static"])
    report["summary"]["0"]["lora"]["ours"]["step_forms"] = ["compiled"] * 3
    lines = benchmark_report.table(report, markdown=True).splitlines()
    assert lines[3].startswith("| 0 | lora | ours | 0.10 |")
    assert lines[4].startswith("| 0 | lora | ours-off [static, traced] | 0.40 | 0.20 | 2.00 |")
