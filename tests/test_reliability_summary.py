"""The summary in one streaming pass: byte for byte the figures the list-based summary gave (golden
files made by it, tests/fixtures/summary_golden), fed live by the writer or read back one record at a
time; the server section the same from its tally; a killed run's tasks counted as interrupted; records
reach the disk without waiting for the next one."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

import pytest

from simulator.metrics import histograms as H
from simulator.metrics import results
from simulator.metrics import server as server_metrics
from simulator.metrics.records import CallRecord, TaskRecord
from simulator.metrics.results import ResultWriter, Window
from simulator.metrics.summary import load_summary, rebuild, summarize
from simulator.metrics.tally import MESSAGE_KINDS, OTHER_MESSAGES, RunTally
from simulator.pipeline.plan import RunPlan
from simulator.pipeline.record import Outcome, Recorder
from simulator.task_run import DriverResult
from simulator.workload import Workload

GOLDEN = Path(__file__).resolve().parent / "fixtures" / "summary_golden"
sys.path.insert(0, str(GOLDEN))
from make_golden import EXPECTED, resolve  # noqa: E402

FOLDERS = sorted(p.name for p in GOLDEN.iterdir() if (p / EXPECTED).exists())


def goldens(name: str) -> list[dict]:
    with open(GOLDEN / name / EXPECTED) as fh:
        return [json.loads(line) for line in fh]


def without_messages(summary) -> str:
    """summary.json's text as the list-based summary wrote it: the error messages are new."""
    data = summary.to_dict()
    data.pop("error_messages", None)
    return json.dumps(data, indent=1, default=str)


def test_the_golden_folders_cover_windows_slos_failures_subtasks_and_classes():
    assert {"run-clean", "run-faults", "run-stall", "run-twin", "sim-quickstart", "synthetic"} <= set(FOLDERS)
    seen = {"excluded": False, "failed": False, "cancelled": False, "sub": False, "classes": False, "slo": False}
    for name in FOLDERS:
        for golden in goldens(name):
            s = json.loads(golden["summary"])
            seen["excluded"] |= s["calls"]["excluded_by_window"] > 0 and s["tasks"]["excluded_by_window"] > 0
            seen["failed"] |= s["tasks"]["failed"] > 0 and s["failed"] > 0
            seen["cancelled"] |= s["tasks"]["cancelled"] > 0
            seen["sub"] |= s["tasks"]["sub_tasks_finished"] > 0
            seen["classes"] |= len(s["tasks"]["by_class"]) > 2
            seen["slo"] |= all(s["slo"].get(k) for k in ("ttft_ms", "tpot_ms", "task_s"))
    assert all(seen.values()), seen


@pytest.mark.parametrize("name", FOLDERS)
def test_streaming_summary_is_byte_identical_to_the_list_based_one(name):
    folder = GOLDEN / name
    for golden in goldens(name):
        # read back one record at a time (generators: nothing holds the records)
        summary, hists = summarize(results.iter_calls(folder), results.iter_tasks(folder),
                                   **resolve(golden["variant"], folder))
        assert without_messages(summary) == golden["summary"], golden["variant"]
        assert H.encode_all(hists) == golden["histograms"], golden["variant"]


@pytest.mark.parametrize("name", ["run-faults", "synthetic"])
def test_the_writer_fed_tally_gives_the_same_summary_as_reading_back(name, tmp_path):
    source = GOLDEN / name
    variant = goldens(name)[2]["variant"]  # a window that cuts, every SLO target, planned counts
    args = resolve(variant, source)
    tally = RunTally(args["window"], args["slo"])
    with ResultWriter(tmp_path, args["window"], sinks=(tally,)) as writer:
        for c in results.iter_calls(source):
            writer.call(c)
        for t in results.iter_tasks(source):
            writer.task(t)
    plan = RunPlan(workload=Workload(()), folder=tmp_path, window=args["window"], planned=args["planned"],
                   slo=args["slo"])
    ended = DriverResult(args["stop_reason"], 0, 0, 0.0)
    assert ended.partial == args["partial"]
    live = Recorder(plan).finish(Outcome(ended, None, tally=tally)).to_dict()
    read_back_tally = RunTally(args["window"], args["slo"]).feed(results.iter_calls(tmp_path),
                                                                 results.iter_tasks(tmp_path))
    read_back = Recorder(plan).finish(Outcome(ended, None, tally=read_back_tally)).to_dict()
    assert live == read_back
    data = dict(live)
    data.pop("result_dir")
    data.pop("error_messages")
    assert json.dumps(data, indent=1, default=str) == goldens(name)[2]["summary"]


def test_error_messages_are_counted_with_their_class_most_frequent_first():
    folder = GOLDEN / "run-faults"
    summary, _ = summarize(results.iter_calls(folder), results.iter_tasks(folder))
    messages = [(m.error_class, m.message, m.count) for m in summary.error_messages]
    assert messages[0][2] >= messages[-1][2]
    assert ("http_5xx", "HTTP 500: injected fault http_500", summary.errors["http_5xx"]) in messages
    assert sum(m[2] for m in messages) == sum(summary.errors.values())
    clean = GOLDEN / "run-clean"
    assert "error_messages" not in summarize(results.iter_calls(clean), results.iter_tasks(clean))[0].to_dict()


def test_distinct_error_messages_are_bounded():
    tally = RunTally()
    base = CallRecord("t", "c", 0, 0, 0.0, 0.0, 1.0, False, error_class="http_4xx")
    for i in range(MESSAGE_KINDS + 50):
        tally.call(CallRecord(**{**results.record_dict(base), "error_message": f"request {i} refused " + "x" * 500}))
    assert len(tally.messages) == MESSAGE_KINDS + 1
    assert tally.messages[("http_4xx", OTHER_MESSAGES)] == 50
    assert all(len(message) <= 300 for _, message in tally.messages)


@pytest.mark.parametrize("name", ["run-clean", "run-faults", "run-stall", "run-twin"])
def test_server_section_from_its_tally_matches_the_list_based_one(name, tmp_path):
    folder = GOLDEN / name
    written = json.loads((folder / "summary.json").read_text())["server"]
    tally = server_metrics.ServerTally().feed(results.iter_calls(folder))
    for task in results.iter_tasks(folder):  # as the writer feeds them: each task after its calls
        tally.task(task)
    join = None
    if (folder / server_metrics.SERVER_METRICS_FILE).exists():
        join = server_metrics.TimelineJoin([server_metrics.Sample(row.pop("t"), row) for row in server_metrics.read_samples(folder)])
    rows = [server_metrics.task_row(task, cached, join.loads(task) if join is not None else None)
            for task, cached in zip(results.iter_tasks(folder), tally.ended())]
    values = server_metrics.write_task_rows(tmp_path, rows)
    assert (tmp_path / server_metrics.SERVER_TASKS_FILE).read_bytes() == (folder / server_metrics.SERVER_TASKS_FILE).read_bytes()
    section = server_metrics.section(tally, values, len(rows), written["timeline"], interval_s=written["interval_s"],
                                     note=written.get("note"))
    assert json.dumps(section) == json.dumps(written)
    # the list-based entry point gives the same
    listed = server_metrics.server_section(rows, results.read_calls(folder), written["timeline"],
                                           interval_s=written["interval_s"], note=written.get("note"))
    assert listed == section


def killed_folder(tmp_path: Path, started: int) -> Path:
    """A folder as a killed run leaves it: run.json, records of what ended, progress.json, no summary."""
    folder = tmp_path / "killed"
    with ResultWriter(folder, Window()) as writer:
        results.write_json(folder, results.RUN_FILE,
                           {"window": {"start": 0.0, "end": None}, "planned": {"tasks": 6, "calls": 12, "subtasks": 0}})
        writer.call(CallRecord("a", "c", 0, 0, 0.0, 0.0, 0.5, True, ttft=0.1, output_tokens=3))
        writer.call(CallRecord("a", "c", 1, 0, 0.6, 0.6, 0.9, True, ttft=0.1, output_tokens=3))
        writer.task(TaskRecord("a", "c", 0.0, 0.9, True, 2, 2, 0.8, 0.1, 0.0))
        writer.call(CallRecord("b", "c", 0, 0, 0.2, 0.2, 0.7, True, ttft=0.1, output_tokens=3))  # b never ended
        writer.started(started)
    return folder


def test_a_killed_runs_started_tasks_are_interrupted_not_not_started(tmp_path, capsys):
    folder = killed_folder(tmp_path, started=3)
    assert json.loads((folder / results.PROGRESS_FILE).read_text()) == {"tasks_started": 3}
    summary, _ = rebuild(folder)
    tasks = summary.tasks
    assert (tasks.planned, tasks.finished_all, tasks.interrupted, tasks.not_started) == (6, 1, 2, 3)
    assert tasks.planned == tasks.finished_all + tasks.interrupted + tasks.not_started
    from simulator.cli import main

    assert main(["report", str(folder)]) == 0
    printed = capsys.readouterr().out
    assert "PARTIAL (rebuilt from records (no summary.json)): 2 of 6 tasks interrupted, 3 not started" in printed
    assert "6 judged (arriving in the window): 1 completed, 0 failed, 0 cancelled, 2 interrupted, 3 not started" in printed
    # a folder from before progress.json: counted as before
    (folder / results.PROGRESS_FILE).unlink()
    assert load_summary(folder).tasks.interrupted is None and load_summary(folder).tasks.not_started == 5


async def test_a_record_reaches_the_disk_without_another_record(tmp_path):
    writer = ResultWriter(tmp_path, Window(), flush_interval=0.05)
    writer.call(CallRecord("a", "c", 0, 0, 0.0, 0.0, 0.5, True))  # the first: flushed at once
    writer.call(CallRecord("a", "c", 1, 0, 0.6, 0.6, 0.9, True))  # buffered, a timer pushes it out
    path = tmp_path / results.CALLS_FILE
    deadline = time.monotonic() + 5.0
    while path.read_text().count("\n") < 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)  # poll the file: the writer is not called again
    assert path.read_text().count("\n") == 2
    writer.close()
