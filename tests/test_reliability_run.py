"""`agentload run` fails when it should and says why: the preflight (unreachable server, wrong model,
refused key) before any result folder; configuration errors before any folder; exit codes for failed
calls and missed SLOs; the most frequent error messages in the report; SIGTERM and SIGHUP stop a run
as Ctrl-C does; a run killed outright leaves records that `report` accounts for."""

from __future__ import annotations

import json
import signal
import socket

import pytest

from reliability_helpers import (
    emulator_thread, free_port, lines, run_cli, scenario_file, wait_for, workload,
)
from simulator import scenario as sc
from simulator.cli import main
from simulator.cli.run import banner
from simulator.errors import InputError
from simulator.metrics import results
from simulator.metrics.summary import CallAccounting, Summary
from simulator.metrics.verdict import failed_share, verdict
from simulator.workload import Call, Task, Workload


def run(tmp_path, scenario, *extra: str) -> int:
    return main(["run", str(scenario), "-o", str(tmp_path / "result"), "--no-progress", *extra])


def test_an_unreachable_server_fails_the_preflight_without_a_result_folder(tmp_path, capsys):
    scen = scenario_file(tmp_path, f"target: {{base_url: 'http://127.0.0.1:{free_port()}', connect_timeout: 2}}\n")
    assert run(tmp_path, scen) == 3
    err = capsys.readouterr().err
    assert "preflight" in err and "unreachable" in err and "(connect)" in err
    assert not (tmp_path / "result").exists()
    # the banner announced where results would go; the error says none were made
    assert f"results will go to {tmp_path / 'result'}" in err and f"results: {tmp_path / 'result'}" not in err
    assert err.rstrip().endswith("no result folder was made")


def test_a_wrong_model_fails_the_preflight_naming_the_models_served(tmp_path, capsys):
    with emulator_thread(ttft=0.001, itl=0.001) as emu:
        scen = scenario_file(tmp_path, f"target: {{base_url: '{emu.url}', model: no-such-model}}\n")
        assert run(tmp_path, scen) == 3
    err = capsys.readouterr().err
    assert "'no-such-model' is not served" in err and "agentload-emulator" in err
    assert not (tmp_path / "result").exists()


def test_a_refused_key_fails_the_preflight(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("AGENTLOAD_TEST_KEY", "wrong-key-value")
    with emulator_thread(ttft=0.001, itl=0.001, api_key="right-key-value") as emu:
        scen = scenario_file(tmp_path, f"target: {{base_url: '{emu.url}', api_key_env: AGENTLOAD_TEST_KEY}}\n")
        assert run(tmp_path, scen) == 3
    err = capsys.readouterr().err
    assert "HTTP 401" in err and "authentication failed" in err
    assert not (tmp_path / "result").exists()


def test_without_preflight_a_wrong_model_fails_every_call_exit_1_and_the_404_text_is_shown(tmp_path, capsys):
    with emulator_thread(ttft=0.001, itl=0.001) as emu:
        scen = scenario_file(tmp_path, f"target: {{base_url: '{emu.url}', model: no-such-model}}\n")
        assert run(tmp_path, scen, "--no-preflight") == 1
    out, err = capsys.readouterr()
    assert "The model `no-such-model` does not exist." in out  # the report's error table
    assert "call attempts failed" in err and "does not exist" in err
    summary = json.loads((tmp_path / "result" / "summary.json").read_text())
    [top] = summary["error_messages"]
    assert top == {"error_class": "http_4xx", "message": "HTTP 404: The model `no-such-model` does not exist.",
                   "count": summary["calls"]["attempts"]}


def test_failed_calls_beyond_the_share_exit_1_and_within_it_0(tmp_path, capsys):
    load = workload(tasks=8, calls=4)
    text = "emulator: {ttft: 0.001, itl: 0.001, faults: ['http_500:0.3'], seed: 1}\n"
    assert run(tmp_path, scenario_file(tmp_path, text, load)) == 1
    summary = Summary.model_validate_json((tmp_path / "result" / "summary.json").read_text())
    assert 0.01 < failed_share(summary) < 1
    assert main(["run", str(tmp_path / "scenario.yaml"), "-o", str(tmp_path / "again"), "--no-progress",
                 "--max-failed-share", "0.99"]) == 0
    assert "--max-failed-share" in capsys.readouterr().err


def test_a_missed_slo_exits_4_only_with_fail_on_slo(tmp_path, capsys):
    scen = scenario_file(tmp_path, "emulator: {ttft: 0.02, itl: 0.001}\nslo: {ttft_ms: {p99: 1}}\n")
    assert run(tmp_path, scen) == 0
    assert main(["run", str(scen), "-o", str(tmp_path / "strict"), "--no-progress", "--fail-on-slo"]) == 4
    assert "SLO missed: ttft_ms p99" in capsys.readouterr().err
    met = scenario_file(tmp_path, "emulator: {ttft: 0.001, itl: 0.001}\nslo: {ttft_ms: {p99: 5000}}\n")
    assert main(["run", str(met), "-o", str(tmp_path / "met"), "--no-progress", "--fail-on-slo"]) == 0


def test_the_failed_share_leaves_cancelled_calls_out():
    summary = Summary(calls=CallAccounting(attempts=10, ok=5, failed_attempts=1, cancelled=4))
    assert failed_share(summary) == pytest.approx(1 / 6)
    assert verdict(summary, max_failed_share=0.2).code == 0
    assert verdict(summary, max_failed_share=0.1).code == 1
    assert verdict(summary, signum=signal.SIGTERM).code == 143
    assert failed_share(Summary()) == 0.0


@pytest.mark.parametrize("text,where", [
    ("target: {base_url: 'http://127.0.0.1:9', api_key_env: AGENTLOAD_UNSET_KEY}\n", "AGENTLOAD_UNSET_KEY is not set"),
    ("target: {base_url: 'http://user:pw@127.0.0.1:9', headers: {Authorization: 'Bearer x'}}\n", "credentials given twice"),
    ("target: {base_url: 'http://127.0.0.1:9', headers: {X-Api-Key: \"a\\r\\nInjected: 1\"}}\n", "target.headers"),
    ("target: {base_url: 'nan'}\n", "target.base_url"),
    ("target: {base_url: 'http://127.0.0.1:99999'}\n", "target.base_url"),
])
def test_a_bad_configuration_is_an_input_error_before_any_result_folder(tmp_path, capsys, monkeypatch, text, where):
    monkeypatch.delenv("AGENTLOAD_UNSET_KEY", raising=False)
    assert run(tmp_path, scenario_file(tmp_path, text)) == 2
    err = capsys.readouterr().err
    assert where in err and "Traceback" not in err and "malformed" not in err
    assert not (tmp_path / "result").exists()


def test_a_header_with_a_line_break_is_refused_at_load_without_echoing_its_value(tmp_path):
    path = scenario_file(tmp_path, "target: {base_url: 'http://127.0.0.1:9', headers: {X-Key: \"s3cr3t\\nX: y\"}}\n")
    with pytest.raises(InputError) as err:
        sc.load(path)
    assert err.value.path == "target.headers" and "line break" in str(err.value) and "s3cr3t" not in str(err.value)


def test_the_banner_gives_the_arrival_span_and_an_estimate_of_the_run():
    # the recorded server time (5 s) is the trace's, not the target's: it never counts
    tasks = tuple(Task(f"t{i}", (Call(10, 2), Call(10, 2, gap=30.0, server_time=5.0)), arrival=60.0 * i)
                  for i in range(5))
    served = sc.parse("workload: {trace: x.jsonl}\ntarget: {base_url: 'http://127.0.0.1:8000'}\n", "x.yaml")
    line = banner(served, Workload(tasks), "out")
    assert "arrivals over 4 min 0 s" in line and "run of at least 4 min 30 s" in line
    assert "the server's time comes on top" in line and "target: http://127.0.0.1:8000" in line
    cut = sc.parse("workload: {trace: x.jsonl}\ntarget: {base_url: 'http://h:1'}\nrun: {duration: 100, drain: 10}\n",
                   "x.yaml")
    assert "(run.duration starts 2 of them)" in banner(cut, Workload(tasks), "out")
    assert "run of at least 1 min 10 s" in banner(cut, Workload(tasks), "out")
    # the emulator: its calls' time counts (each call 10 tokens at 60 ms and 2 steps of 8.1 ms: 0.62 s)
    slow = sc.parse("workload: {trace: x.jsonl}\nemulator: {prefill_per_token: 0.06}\n", "x.yaml")
    line = banner(slow, Workload(tasks), "out")
    assert "run of about 4 min 31 s" in line and "queueing under load comes on top" in line
    assert "target: built-in emulator, batched timing: steps of 8 ms + 0.1 ms a running sequence" in line


def test_the_banner_says_which_timing_the_emulator_runs_and_warns_of_a_zero_latency_server():
    load = Workload((Task("t", (Call(10, 2),)),))
    default = banner(sc.parse("workload: {trace: x.jsonl}\n", "x.yaml"), load, "out")
    assert "target: built-in emulator, default timing, ~ one H100 serving an 8B model on vLLM: steps of 8 ms" in default
    assert "zero-latency" not in default.lower()
    profile = banner(sc.parse("workload: {trace: x.jsonl}\nemulator: {profile: tiny-vllm-cpu}\n", "x.yaml"), load, "out")
    assert "target: built-in emulator, profile tiny-vllm-cpu" in profile
    for zero in ("{ttft: 0, itl: 0}", "{prefill_per_token: 0, decode_per_seq: 0, decode_base: 0}"):
        line = banner(sc.parse(f"workload: {{trace: x.jsonl}}\nemulator: {zero}\n", "x.yaml"), load, "out")
        assert "a zero-latency server" in line and "warning: ZERO-LATENCY SERVER" in line, zero


@pytest.mark.parametrize("signum,code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_sigterm_and_sighup_stop_the_run_with_its_partial_summary(tmp_path, signum, code):
    load = workload(tasks=6, calls=4, out=100, gap=0.0, every=0.05)
    # a generous task SLO: only the tasks the stop cut off can miss it
    scen = scenario_file(tmp_path, "emulator: {ttft: 0.005, itl: 0.005}\nslo: {task_s: {p90: 600}}\n", load)
    out = tmp_path / "result"
    proc = run_cli("run", str(scen), "-o", str(out), "--no-progress")
    try:
        wait_for(lambda: lines(out / results.CALLS_FILE) >= 2, proc=proc)  # the run is measuring
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == code, stderr
    assert "stopped by a signal; partial results saved" in stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["partial"] is True and summary["stop_reason"] == "interrupted"
    tasks = summary["tasks"]
    assert tasks["planned"] == tasks["completed"] + tasks["failed"] + tasks["cancelled"] + tasks["not_started"]
    assert summary["calls"]["cancelled"] >= 1 and "PARTIAL (interrupted)" in stdout
    assert tasks["judged"] == tasks["planned"] and summary["slo"]["task_s"]["met"] is False  # the stop counts


def test_a_run_killed_outright_is_reported_with_its_started_tasks_interrupted(tmp_path, capsys):
    load = workload(tasks=6, calls=4, out=100, gap=0.0, every=0.2, subtasks=False)
    scen = scenario_file(tmp_path, "emulator: {ttft: 0.005, itl: 0.005}\n", load)
    out = tmp_path / "result"
    proc = run_cli("run", str(scen), "-o", str(out), "--no-progress")
    try:
        wait_for(lambda: lines(out / results.CALLS_FILE) >= 3, proc=proc)
        proc.kill()
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert not (out / "summary.json").exists()
    assert main(["report", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    tasks = summary["tasks"]
    assert tasks["interrupted"] >= 1, "tasks with calls sent but no end are interrupted, not 'not started'"
    assert tasks["planned"] == tasks["finished_all"] + tasks["interrupted"] + tasks["not_started"]
    started = {c.task_id for c in results.read_calls(out)}
    assert tasks["finished_all"] + tasks["interrupted"] >= len(started)


def test_a_signal_during_the_preflight_ends_the_command_without_a_result_folder(tmp_path):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    scen = scenario_file(tmp_path, f"target: {{base_url: 'http://127.0.0.1:{port}', stall_timeout: 600}}\n")
    out = tmp_path / "result"
    proc = run_cli("run", str(scen), "-o", str(out), "--no-progress")
    try:
        listener.settimeout(120)
        conn, _ = listener.accept()  # the preflight asks for the model list, which never comes
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
        conn.close()
    finally:
        listener.close()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, stderr
    assert "stopped by SIGTERM before the run started; nothing measured, no result folder was made" in stderr
    assert not out.exists()
