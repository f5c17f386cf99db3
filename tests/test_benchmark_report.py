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


def test_window_statistics_tell_the_traced_phase_from_a_stall():
    """Steps before the switch (traced, while the compiler works) get their own median; the
    steps over twice the run's median are also counted from the switch on, where a stall of
    the loop would show."""
    times = [0.5] + [0.0022] * 3 + [0.004] + [0.001] * 10 + [0.0031] + [0.001] * 4
    stats = benchmark_report.window_statistics(times, switch=5)
    assert stats["steps"] == 20 and stats["switch_step"] == 5
    assert stats["median_ms"] == 1.0 and stats["switch_ms"] == 4.0
    assert stats["before_switch_median_ms"] == 2.2
    assert stats["over_2x_median"] == 5  # three traced steps, the switch, the stall
    assert stats["over_2x_median_from_switch"] == 2  # the switch and the stall
    assert stats["max_ms"] == 4.0 and stats["max_step"] == 5  # the first step is not counted
    ort = benchmark_report.window_statistics([0.5, 0.001, 0.003, 0.001], switch=None)
    assert ort["before_switch_median_ms"] is None and ort["over_2x_median_from_switch"] is None
    assert ort["over_2x_median"] == 1 and ort["max_step"] == 3


def test_fresh_table_leaves_columns_of_older_reports_empty():
    row = {"steps": 100, "ready_s": 1.0, "median_ms": 0.2, "max_ms": 5.0, "over_2x_median": 3}
    report = {"fresh_seconds": 120, "fresh_summary": {"0": {"lora": {"ort": dict(row), "ours": dict(row, steps=110)}}}}
    report["fresh_summary"]["0"]["lora"]["ours"].update(
        switch_step=40, switch_ms=1.0, before_switch_median_ms=0.45, over_2x_median_from_switch=2
    )
    lines = benchmark_report.fresh_table(report, markdown=True).splitlines()
    assert "| compiled from step | compiled from s | switch step ms |" in lines[0]
    assert "| median before switch ms | > 2x median from switch |" in lines[0]
    assert lines[2].endswith("| 3 | - | - | - | - | - | - | - | - | - | - |")
    assert (
        lines[3]
        == "| 0 | lora | ours | 110 | 1.10 | - | 1.0 | 0.20 | 5.0 | 3 | 40 | - | 1.0 | 0.45 | 2 | - | - | - | - | - |"
    )
    report["fresh_first_on_machine"] = True  # TorchInductor's cache started empty too
    assert "| steps in 120 s (first on machine) |" in benchmark_report.fresh_table(report, markdown=True)


def test_fresh_table_gives_each_rounds_ratio_to_ort():
    """The median over rounds hides their spread (+-5-10% on a noisy host): the table gives
    ours / ORT for each interleaved round, skipping a round in which either side failed."""
    row = {"steps": 100, "ready_s": 1.0, "median_ms": 0.2, "max_ms": 5.0}
    ort_runs = [dict(row, steps=s) for s in (1000, 1000, 800, 900)]
    ours_runs = [dict(row, steps=s) for s in (1050, 960, 1000)] + [{"error": "crashed"}]
    report = {
        "fresh_seconds": 120,
        "fresh_summary": {"0": {"lora": {"ort": dict(row, steps=950), "ours": dict(row, steps=1000)}}},
        "fresh_raw": {"0": {"lora": {"ort": ort_runs, "ours": ours_runs}}},
    }
    lines = benchmark_report.fresh_table(report, markdown=True).splitlines()
    assert "| vs ort | vs ort per round |" in lines[0]
    assert lines[2].startswith("| 0 | lora | ort | 950 | 1.00 | - |")
    assert lines[3].startswith("| 0 | lora | ours | 1000 | 1.05 | 1.05 / 0.96 / 1.25 |")
