"""The HTML, PNG and CSV reports of real result folders (a live run on the emulator, simulations, a
study.json), read back without a browser: every figure cell against the result files, escaping of
hostile strings, self-containment, the workload fingerprint check of comparisons, bad study files.
tests/test_report_browser.py opens the same pages in Chromium."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

import report_folders as rf
from simulator.cli import main
from simulator.errors import InputError
from simulator.metrics import results


Page = rf.Page


@pytest.fixture(scope="module")
def folders(report_runs, tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("report-html")
    return {"live": report_runs["live"], "sim": report_runs["sim"], "other-workload": report_runs["other"],
            "capped": rf.simulation(tmp, "capped", 0, "--set", "run.max_in_flight=2")}


def page_of(*argv: str) -> tuple[Page, str]:
    out = Path(argv[argv.index("--html") + 1])
    assert main(list(argv)) == 0
    text = out.read_text(encoding="utf-8")
    return Page(text), text


def summary_json(folder: Path) -> dict:
    return json.loads((folder / results.SUMMARY_FILE).read_text())


def assert_self_contained(page: Page, text: str) -> None:
    assert "Content-Security-Policy" in text and "default-src 'none'" in text
    assert not [tag for tag, _ in page.tags if tag in ("script", "iframe", "object", "embed", "link", "img")]
    for tag, attrs in page.tags:
        for name in ("src", "href"):
            assert not (attrs.get(name) or "#").split("#")[0], (tag, attrs)  # only links inside the page


def test_run_page_shows_every_figure_of_summary_json_and_loads_nothing(folders, tmp_path):
    page, text = page_of("report", str(folders["live"]), "--html", str(tmp_path / "run.html"))
    assert_self_contained(page, text)
    assert check_count(page, [summary_json(folders["live"])]) > 80
    ids = {attrs.get("id") for tag, attrs in page.tags if tag == "figure"}
    assert ids == {"fig-task-completion-cdf", "fig-task-time-breakdown", "fig-call-latency-cdf", "fig-timeline"}
    assert sum(tag == "svg" for tag, _ in page.tags) == 4
    words = " ".join(page.text)
    for expected in ("requests running", "KV-cache usage", "http_5xx", "injected fault", "fingerprint of the workload"):
        assert expected in words, expected


def check_count(page: Page, documents: list) -> int:
    return rf.check_cells(page.cells, documents)


def test_simulation_page_shows_the_twins_requests_and_kv_cache_over_time(folders, tmp_path):
    """A simulation samples its twin as a live run scrapes /metrics: the timeline has the same panels."""
    page, text = page_of("report", str(folders["sim"]), "--html", str(tmp_path / "sim-time.html"))
    assert_self_contained(page, text)
    drawn = " ".join(page.svg_text)
    for expected in ("server requests", "running", "waiting", "KV-cache usage",
                     "prefix-cache hits (share of queried tokens)"):
        assert expected in drawn, expected
    assert "No server /metrics" not in " ".join(page.text)
    check_count(page, [summary_json(folders["sim"])])


def test_a_cell_showing_another_figure_is_caught(folders, tmp_path):
    page, _ = page_of("report", str(folders["sim"]), "--html", str(tmp_path / "sim.html"))
    cell = next(c for c in page.cells if json.loads(c["source"]) == ["p99_ttft_ms"])
    wrong = dict(cell, source=json.dumps(["p50_ttft_ms"]))
    with pytest.raises(AssertionError):
        rf.check_cells([wrong], [summary_json(folders["sim"])])


def test_hostile_strings_from_trace_and_server_are_shown_as_text(folders, tmp_path):
    folder = tmp_path / "hostile"
    shutil.copytree(folders["live"], folder)
    rf.add_hostile_failures(folder)
    page, text = page_of("report", str(folder), "--html", str(tmp_path / "hostile.html"))
    assert_self_contained(page, text)
    for raw in (rf.HOSTILE_CLASS, rf.HOSTILE_ID, rf.HOSTILE_MESSAGE, "http_5xx<br>"):
        assert raw not in text  # never as markup ...
    words = "".join(page.text)
    for raw in (rf.HOSTILE_CLASS, rf.QUOTED_CLASS, rf.HOSTILE_MESSAGE, "http_5xx<br>"):
        assert raw in words, raw  # ... always as the text it is
    legends = "".join(page.svg_text)
    for raw in (rf.HOSTILE_CLASS, rf.QUOTED_CLASS):  # in the figures too, literally (no math mode for '$')
        assert f"{raw} (3)" in legends, raw
    assert not [attrs for _, attrs in page.tags if any(a.startswith("on") for a in attrs)]
    check_count(page, [summary_json(folder)])


def test_fingerprint_is_the_same_for_the_same_workload_on_both_clocks(folders):
    prints = {name: json.loads((f / results.RUN_FILE).read_text())["fingerprint"] for name, f in folders.items()}
    assert prints["live"] == prints["sim"]
    assert prints["other-workload"]["workload"] != prints["sim"]["workload"]
    assert prints["capped"]["workload"] == prints["sim"]["workload"]
    assert prints["capped"]["run"] != prints["sim"]["run"]
    assert prints["capped"]["slo"] == prints["sim"]["slo"]


def test_comparison_warns_only_about_folders_that_replayed_something_else(folders, tmp_path, capsys):
    argv = [str(folders[name]) for name in ("sim", "live", "other-workload", "capped")]
    page, text = page_of("compare", *argv, "--html", str(tmp_path / "cmp.html"))
    assert_self_contained(page, text)
    warnings = [w for w in capsys.readouterr().out.splitlines() if w.startswith("warning:")]
    assert len(warnings) == 2, warnings
    assert "other replayed a different workload" in warnings[0]
    assert "capped ran with other run settings" in warnings[1] and "max_in_flight None → 2" in warnings[1]
    words = " ".join(page.text)
    assert "other replayed a different workload" in words and "max_in_flight" in words
    assert check_count(page, [summary_json(Path(f)) for f in argv]) > 4 * 40
    assert {c["folder"] for c in page.cells} == {"0", "1", "2", "3"}


def test_comparison_without_fingerprints_says_it_cannot_check(folders, tmp_path, capsys):
    old = tmp_path / "old"
    shutil.copytree(folders["sim"], old)
    info = json.loads((old / results.RUN_FILE).read_text())
    del info["fingerprint"]
    (old / results.RUN_FILE).write_text(json.dumps(info))
    assert main(["compare", str(folders["sim"]), str(old), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert len(out["warnings"]) == 1 and "no workload fingerprint" in out["warnings"][0]
    row = next(r for r in out["rows"] if r["figure"] == "TTFT p99")
    assert row["a"] == row["b"] and row["ratio"] == 1.0


def test_study_page_shows_study_json_and_its_flags(tmp_path):
    page, text = page_of("report", str(rf.STUDY_FIXTURE), "--html", str(tmp_path / "study.html"))
    assert_self_contained(page, text)
    study = json.loads((rf.STUDY_FIXTURE / "study.json").read_text())
    assert check_count(page, [study]) > 150
    words = " ".join(page.text)
    assert "bfloat16 changes the model's outputs: 50.0% identical" in words
    assert "1 point(s) failed: bfloat16 (sweep at load 32): the server exited with code 1" in words
    assert "default and bfloat16 within noise" in words and "no twin equivalent (flags only): bfloat16" in words
    ids = {attrs.get("id") for tag, attrs in page.tags if tag == "figure"}
    assert ids == {"fig-study-goodput", "fig-study-task-time", "fig-study-cost", "fig-study-twin"}


def test_study_page_says_a_config_moved_the_log_probabilities_with_the_same_outputs(tmp_path):
    study = json.loads((rf.STUDY_FIXTURE / "study.json").read_text())
    flagged = next(c for c in study["configs"] if (c["quality"] or {}).get("status") == "flagged")
    flagged["quality"].update(reason="logprobs", identical_share=1.0, mean_abs_logprob_delta=0.0025)
    folder = tmp_path / "study"
    folder.mkdir()
    (folder / "study.json").write_text(json.dumps(study))
    page, _ = page_of("report", str(folder), "--html", str(tmp_path / "s.html"))
    words = " ".join(page.text)
    assert f"{flagged['name']} moves the model's log probabilities by 0.0025 on average" in words
    assert "changes the model's outputs" not in words


def test_hostile_study_strings_are_escaped(tmp_path):
    study = json.loads((rf.STUDY_FIXTURE / "study.json").read_text())
    study["name"] = rf.HOSTILE_CLASS
    study["configs"][1]["name"] = rf.QUOTED_CLASS
    study["configs"][2]["differs_by"] = rf.HOSTILE_ID
    study["configs"][1]["points"][2]["error"] = rf.HOSTILE_MESSAGE
    folder = tmp_path / "study"
    folder.mkdir()
    (folder / "study.json").write_text(json.dumps(study))
    page, text = page_of("report", str(folder), "--html", str(tmp_path / "s.html"))
    assert rf.HOSTILE_CLASS not in text and rf.HOSTILE_MESSAGE not in text
    assert rf.HOSTILE_ID not in text
    words = "".join(page.text)
    for raw in (rf.HOSTILE_CLASS, rf.QUOTED_CLASS, rf.HOSTILE_MESSAGE, rf.HOSTILE_ID):
        assert raw in words, raw
    assert f"{rf.QUOTED_CLASS}" in "".join(page.svg_text)  # a config name in the figures' legends


@pytest.mark.parametrize("change, field", [
    (lambda s: s["configs"][0]["points"][0].update(status="maybe"), "status"),
    (lambda s: s["configs"][2].pop("name"), "name"),
    (lambda s: s.update(agentload_study=7), "agentload_study"),
    (lambda s: s["configs"][1].update(name="default"), "configs"),
])
def test_a_bad_study_json_is_an_input_error_naming_the_field(tmp_path, change, field):
    from simulator.study.model import load_study

    study = json.loads((rf.STUDY_FIXTURE / "study.json").read_text())
    change(study)
    (tmp_path / "study.json").write_text(json.dumps(study))
    with pytest.raises(InputError) as err:
        load_study(tmp_path)
    assert err.value.file == str(tmp_path / "study.json")
    if field:
        assert err.value.field == field


def test_png_and_csv_hold_the_same_figures_and_records(folders, tmp_path):
    folder = folders["live"]
    assert main(["report", str(folder), "--png", str(tmp_path / "png"), "--csv", str(tmp_path / "csv")]) == 0
    pngs = sorted(p.name for p in (tmp_path / "png").iterdir())
    assert pngs == ["call-latency-cdf.png", "task-completion-cdf.png", "task-time-breakdown.png", "timeline.png"]
    for name in pngs:
        assert (tmp_path / "png" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with open(tmp_path / "csv" / "calls.csv", newline="") as fh:
        calls = list(csv.DictReader(fh))
    records = results.read_calls(folder)
    assert len(calls) == len(records)
    assert [c["task_id"] for c in calls] == [r.task_id for r in records]
    assert float(calls[0]["latency"]) == pytest.approx(records[0].latency)
    with open(tmp_path / "csv" / "summary.csv", newline="") as fh:
        summary = dict(csv.reader(fh))
    assert float(summary["p99_ttft_ms"]) == summary_json(folder)["p99_ttft_ms"]
    assert float(summary["tasks.completion_time_s.p99.9"]) == summary_json(folder)["tasks"]["completion_time_s"]["p99.9"]
    assert (tmp_path / "csv" / "server_metrics.csv").exists() and (tmp_path / "csv" / "tasks.csv").exists()


def test_comparison_and_study_csv(folders, tmp_path):
    assert main(["report", str(folders["sim"]), str(folders["capped"]), "--csv", str(tmp_path / "c")]) == 0
    with open(tmp_path / "c" / "comparison.csv", newline="") as fh:
        rows = {r["figure"]: r for r in csv.DictReader(fh)}
    assert float(rows["TTFT p99"]["A: sim"]) == summary_json(folders["sim"])["p99_ttft_ms"]
    assert main(["report", str(rf.STUDY_FIXTURE), "--csv", str(tmp_path / "s")]) == 0
    with open(tmp_path / "s" / "study_points.csv", newline="") as fh:
        points = list(csv.DictReader(fh))
    assert len(points) == 25 and points[0]["config"] == "default"
    assert float(points[0]["goodput_tasks_per_hour"]) == json.loads((rf.STUDY_FIXTURE / "study.json").read_text())[
        "configs"][0]["points"][0]["goodput_tasks_per_hour"]


def test_a_summary_alone_still_makes_a_page(tmp_path):
    folder = tmp_path / "old"
    folder.mkdir()
    (folder / "summary.json").write_text(json.dumps({"output_throughput": 12.5, "p99_ttft_ms": 250.0,
                                                     "tasks": {"throughput_per_hour": 36.0}}))
    page, text = page_of("report", str(folder), "--html", str(tmp_path / "old.html"))
    assert not [tag for tag, _ in page.tags if tag == "svg"]
    assert "no call records" in " ".join(page.text)
    check_count(page, [json.loads((folder / "summary.json").read_text())])


def test_simulate_writes_the_report_it_is_asked_for(tmp_path):
    out = tmp_path / "sim"
    assert main(["simulate", str(rf.scenario(tmp_path / "s")), "-p", "tiny-vllm-cpu", "-o", str(out),
                 "--html", "--csv", str(tmp_path / "csv")]) == 0
    assert (out / "report.html").stat().st_size > 10_000
    assert (tmp_path / "csv" / "calls.csv").exists()
    with open(tmp_path / "csv" / "server_metrics.csv", newline="") as fh:  # the twin's samples
        header = next(csv.reader(fh))
    assert {"t", "num_requests_running", "num_requests_waiting", "kv_cache_usage_perc", "prefix_cache_hits"} <= set(header)


def test_credentials_in_an_old_run_json_do_not_reach_the_page(folders, tmp_path):
    folder = tmp_path / "old-live"
    shutil.copytree(folders["live"], folder)
    info = json.loads((folder / results.RUN_FILE).read_text())
    info.update(emulator=False, base_url="http://alice:s3cr3t-pass@gpu-box:8000?api_key=k3y-value")
    (folder / results.RUN_FILE).write_text(json.dumps(info))
    page, text = page_of("report", str(folder), "--html", str(tmp_path / "old.html"))
    assert "s3cr3t-pass" not in text and "k3y-value" not in text
    assert "live against http://***@gpu-box:8000?api_key=***" in " ".join(page.text)


def test_a_run_killed_before_its_summary_gets_every_latency_histogram_back(folders, tmp_path):
    """A killed run leaves no summary.json and a histograms.json with the live ITL only: the report
    rebuilds the summary and every call histogram from the records."""
    from simulator.metrics import histograms
    from simulator.report.folder_data import load_folder

    killed = tmp_path / "killed"
    shutil.copytree(folders["live"], killed)
    (killed / results.SUMMARY_FILE).unlink()
    whole = histograms.load(folders["live"] / results.HISTOGRAMS_FILE)
    histograms.save(killed / results.HISTOGRAMS_FILE, {"itl": whole["itl"]})
    data = load_folder(killed)
    ok_calls = sum(1 for c in results.iter_calls(killed) if c.ok)
    assert data.summary.partial and ok_calls > 0
    for name in ("ttft", "e2el", "tpot"):
        assert data.histograms[name].get_total_count() == whole[name].get_total_count() > 0, name
    assert data.histograms["itl"].get_total_count() == whole["itl"].get_total_count()
    page, _ = page_of("report", str(killed), "--html", str(tmp_path / "killed.html"))
    assert "fig-call-latency-cdf" in {attrs.get("id") for tag, attrs in page.tags if tag == "figure"}
