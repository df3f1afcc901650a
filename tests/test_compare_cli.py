"""`agentload compare A B`: the figures of two result folders side by side with their ratio, a folder
with partial results marked, and ratios highlighted without a verdict."""

import json

import report_folders as rf
from simulator.cli import main
from simulator.metrics.summary import Summary
from simulator.report.compare import compare_summaries


def _summary(scale: float) -> dict:
    """A summary.json with a few figures only (as an older version, or a hand-written one, may hold)."""
    return {
        "output_throughput": 100.0 * scale,
        "p50_ttft_ms": 20.0 * scale, "p99_ttft_ms": 50.0 * scale,
        "tasks": {"throughput_per_hour": 360.0, "failed": 0,
                  "completion_time_s": {"p50": 2.0 * scale, "p95": 9.0},
                  "by_class": {"x": {"completion_time_s": {"p50": 1.0, "p95": 2.0 * scale}},
                               "y": {"completion_time_s": {"p50": 3.0, "p95": 4.0}}}},
    }


def test_rows_hold_both_values_and_the_ratio_b_over_a():
    a, b = (Summary.model_validate(_summary(scale)) for scale in (1.0, 1.5))
    rows = {r["figure"]: r for r in compare_summaries(a, b)}
    assert rows["output tokens/s"]["ratio"] == 1.5
    assert rows["TTFT p99"]["a"] == 50.0 and rows["TTFT p99"]["b"] == 75.0
    assert rows["completion p95"]["ratio"] == 1.0
    assert rows["x completion p95"]["ratio"] == 1.5
    assert rows["tasks failed"]["ratio"] is None  # 0 in A: no ratio
    assert "TPOT p50" not in rows  # in neither summary


def test_compare_command_reads_two_result_folders(tmp_path, capsys):
    for name, scale in (("real", 1.0), ("twin", 0.5)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "summary.json").write_text(json.dumps(_summary(scale)))
    assert main(["compare", str(tmp_path / "real"), str(tmp_path / "twin"), "--json"]) == 0
    rows = {r["figure"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["TTFT p50"]["ratio"] == 0.5
    assert main(["compare", str(tmp_path / "real"), str(tmp_path / "twin")]) == 0
    assert "TTFT p50" in capsys.readouterr().out
    assert main(["compare", str(tmp_path / "real"), str(tmp_path / "missing")]) == 2
    assert "no such result folder" in capsys.readouterr().err


def _partial(tmp_path, name: str = "cut") -> tuple:
    """A folder whose run was cut off by its drain limit (summary.json only), beside a whole one."""
    whole, cut = _summary(1.0), _summary(1.0)
    for data, cancelled in ((whole, 0), (cut, 6)):
        data["tasks"].update(judged=17, completed=17 - cancelled, cancelled=cancelled, not_started=0)
    cut.update(partial=True, stop_reason="drain_timeout")
    cut["tasks"]["throughput_per_hour"] = 360.0 * 11 / 17
    for folder, data in ((tmp_path / "whole", whole), (tmp_path / name, cut)):
        folder.mkdir()
        (folder / "summary.json").write_text(json.dumps(data))
    return tmp_path / "whole", tmp_path / name


def test_compare_marks_a_partial_folder_in_terminal_json_and_page(tmp_path, capsys):
    whole, cut = _partial(tmp_path)
    state = "PARTIAL (drain_timeout): 6 of 17 tasks cancelled"
    assert main(["compare", str(whole), str(cut), "--html", str(tmp_path / "cmp.html")]) == 0
    out = capsys.readouterr().out
    assert f"B: {cut} — {state}" in " ".join(out.split())  # the title (rich may wrap it)
    assert f"warning: B (cut): {state}." in out
    assert main(["compare", str(whole), str(cut), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["partial"] == [None, state]
    assert data["warnings"][0].startswith(f"B (cut): {state}.")
    page = rf.Page((tmp_path / "cmp.html").read_text(encoding="utf-8"))
    words = " ".join(page.text)
    assert f"B: cut — {state}" in words
    folders = {row[0]: row for row in page.tables["The folders"][1:]}
    assert folders["A"][2] == "complete" and folders["B"][2] == state


def test_a_summary_rebuilt_from_records_is_partial(tmp_path, capsys):
    folder = tmp_path / "crashed"
    folder.mkdir()
    (folder / "calls.jsonl").write_text("")
    (tmp_path / "whole").mkdir()
    (tmp_path / "whole" / "summary.json").write_text(json.dumps(_summary(1.0)))
    assert main(["compare", str(tmp_path / "whole"), str(folder), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["partial"][1] == "PARTIAL (rebuilt from records (no summary.json))"


def test_ratios_carry_no_verdict(tmp_path, capsys):
    whole, cut = _partial(tmp_path)
    assert main(["compare", str(whole), str(cut), "--html", str(tmp_path / "cmp.html")]) == 0
    out = capsys.readouterr().out
    assert "0.647 *" in out and "1.000  " in out  # tasks/hour: 11/17 of A's, marked; equal ones not
    assert "in neither direction" in " ".join(out.split())
    page = rf.Page((tmp_path / "cmp.html").read_text(encoding="utf-8"))
    throughput = {row[0]: row for row in page.tables["Throughput"]}
    assert throughput["figure"][-2:] == ["B/A", "better"]
    assert throughput["tasks/hour"][-2:] == ["0.647", "higher"]
    tones = {attrs.get("class") for tag, attrs in page.tags if tag == "td"}
    assert not any("tone-good" in c or "tone-bad" in c for c in tones if c), tones
    assert any("tone-mark" in c for c in tones if c)
    words = " ".join(page.text)
    assert "not a verdict" in words and "significant" not in words
