"""Memory and time of a run's summary at 10M calls: the streaming tally stays flat.

Synthesizes the records of a run of `--calls` calls (10 calls a task, four task classes, 1% failed
attempts with a few distinct messages, a cool-down window, an SLO on TTFT, TPOT and task time) and
summarises them, each phase in its own process so that its peak resident memory is its own:

- ``live``: the records fed to a `RunTally` (and the server section's `ServerTally`) as a run's
  writer feeds them, built on the fly, never held: what `agentload run` does at the end of a run;
- ``rebuild``: the same records written as a result folder's calls.jsonl and tasks.jsonl
  (``--folder``, a temporary one by default; several GB at 10M calls) and summarised by
  `write_summary` reading them back one at a time: what `agentload report` does for a killed run;
- ``list`` (with ``--list-calls N``): the list-based summary of commit 81bb8bf (read from git) on the
  first N calls, for comparison: its memory grows with the records.

Prints, per phase: calls, seconds, peak resident memory, and that memory less the interpreter's and
imports' (measured in the same process before the work).

    .venv/bin/python benchmarks/summary_memory.py                 # 10M calls
    .venv/bin/python benchmarks/summary_memory.py --calls 1000000 --list-calls 1000000
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Iterator

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from simulator.metrics import results  # noqa: E402
from simulator.metrics.records import CallRecord, TaskRecord  # noqa: E402
from simulator.metrics.results import Window  # noqa: E402
from simulator.metrics.slo import PercentileTarget, Slo  # noqa: E402

LIST_COMMIT = "81bb8bf"
CALLS_PER_TASK = 10
SLO = Slo(ttft_ms=PercentileTarget(p99=500), tpot_ms=PercentileTarget(p90=40), task_s=PercentileTarget(p90=60))
MESSAGES = ("HTTP 503: upstream busy", "ClientPayloadError: Response payload is not completed",
            "HTTP 400: This model's maximum context length is 4096 tokens", "Timeout: nothing from the server for 60 s")


def window(calls: int) -> Window:
    """The measurement window: a cool-down leaves the last tenth of the arrivals out."""
    return Window(0.0, calls // CALLS_PER_TASK * 0.01 * 0.9)


def records(calls: int) -> Iterator[CallRecord | TaskRecord]:
    """The run's records in the order a run ends them: a task's calls, then the task (a task arrives
    every 10 ms)."""
    for t in range(calls // CALLS_PER_TASK):
        tid, cls, arrival = f"task-{t}", f"class-{t % 4}", t * 0.01
        now = arrival
        ok_task = True
        for i in range(CALLS_PER_TASK):
            n = t * CALLS_PER_TASK + i
            latency = 0.2 + (n * 7919 % 1000) / 1000
            failed = n % 100 == 37
            out = 20 + n % 200
            yield CallRecord(
                tid, cls, i, 0, now, now + (n % 7) * 1e-4, now + latency, not failed,
                ttft=None if failed else latency * 0.2, itl_count=0 if failed else out - 1,
                itl_mean=None if failed else latency * 0.8 / out, itl_max=None if failed else latency / 10,
                input_tokens=1000 + 37 * i, output_tokens=0 if failed else out, requested_output_tokens=out,
                cached_tokens=None if failed else 900, status=503 if failed else 200,
                error_class=("http_5xx", "reset", "http_4xx", "stall")[n % 4] if failed else None,
                error_message=MESSAGES[n % 4] if failed else None)
            now += latency + 0.5
            ok_task = ok_task and not failed
        yield TaskRecord(tid, cls, arrival, now, ok_task, CALLS_PER_TASK, CALLS_PER_TASK, now - arrival, 5.0, 0.001,
                         failed_call=None if ok_task else 0, error_class=None if ok_task else "http_5xx",
                         time_in_ttft=0.5)


def peak_mb() -> float:
    """This process's peak resident memory (VmHWM), MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def phase_live(calls: int) -> dict:
    from simulator.metrics.server import ServerTally
    from simulator.metrics.summary import from_tally
    from simulator.metrics.tally import RunTally

    base = peak_mb()
    started = time.perf_counter()
    tally, server = RunTally(window(calls), SLO), ServerTally()
    for r in records(calls):
        if isinstance(r, CallRecord):
            tally.call(r)
            server.call(r)
        else:
            tally.task(r)
            server.task(r)
    summary, _ = from_tally(tally, planned={"tasks": calls // CALLS_PER_TASK, "calls": calls, "subtasks": 0})
    return {"seconds": time.perf_counter() - started, "peak_mb": peak_mb(), "base_mb": base,
            "completed": summary.completed, "attempts": summary.calls.attempts}


def write_folder(folder: Path, calls: int) -> None:
    """calls.jsonl and tasks.jsonl of the synthetic run (as `ResultWriter` writes them), run.json."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / results.CALLS_FILE, "wb") as fc, open(folder / results.TASKS_FILE, "wb") as ft:
        for r in records(calls):
            (fc if isinstance(r, CallRecord) else ft).write(results.record_line(r))
    (folder / results.RUN_FILE).write_text(json.dumps({
        "settings": {"slo": SLO.model_dump(mode="json", by_alias=True, exclude_none=True)},
        "window": {"start": window(calls).start, "end": window(calls).end},
        "planned": {"tasks": calls // CALLS_PER_TASK, "calls": calls, "subtasks": 0}}))


def phase_rebuild(folder: Path, calls: int) -> dict:
    from simulator.metrics.folder import write_summary

    base = peak_mb()
    info = json.loads((folder / results.RUN_FILE).read_text())
    started = time.perf_counter()
    summary = write_summary(folder, window=Window(**info["window"]), slo=SLO, planned=info["planned"], itl=None)
    return {"seconds": time.perf_counter() - started, "peak_mb": peak_mb(), "base_mb": base,
            "completed": summary.completed, "attempts": summary.calls.attempts}


def phase_list(folder: Path, calls: int) -> dict:
    """The list-based summary of `LIST_COMMIT` on the first `calls` calls of the folder."""
    source = subprocess.run(["git", "-C", str(ROOT), "show", f"{LIST_COMMIT}:simulator/metrics/summary.py"],
                            capture_output=True, text=True, check=True).stdout
    module = types.ModuleType("simulator.metrics.summary_list_based")
    module.__package__ = "simulator.metrics"
    sys.modules[module.__name__] = module  # pydantic resolves the models' annotations through it
    exec(compile(source, f"{LIST_COMMIT}:summary.py", "exec"), module.__dict__)
    base = peak_mb()
    started = time.perf_counter()
    call_list = []
    for c in results.iter_calls(folder):
        if len(call_list) == calls:
            break
        call_list.append(c)
    tasks = [t for t in results.iter_tasks(folder)][: calls // CALLS_PER_TASK]
    summary, _ = module.summarize(call_list, tasks, window=window(calls), slo=SLO)
    return {"seconds": time.perf_counter() - started, "peak_mb": peak_mb(), "base_mb": base,
            "completed": summary.completed, "attempts": summary.calls.attempts}


def child(args: argparse.Namespace) -> None:
    folder = Path(args.folder) if args.folder else None
    if args.phase == "live":
        out = phase_live(args.calls)
    elif args.phase == "write":
        started = time.perf_counter()
        write_folder(folder, args.calls)
        out = {"seconds": time.perf_counter() - started, "bytes": sum(p.stat().st_size for p in folder.iterdir())}
    elif args.phase == "rebuild":
        out = phase_rebuild(folder, args.calls)
    else:
        out = phase_list(folder, args.list_calls)
    print(json.dumps(out))


def run_phase(phase: str, args: argparse.Namespace, folder: Path) -> dict:
    argv = [sys.executable, __file__, "--phase", phase, "--calls", str(args.calls), "--folder", str(folder),
            "--list-calls", str(args.list_calls)]
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"phase {phase} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=10_000_000)
    parser.add_argument("--list-calls", type=int, default=0, help="also run the list-based summary on this many calls")
    parser.add_argument("--folder", help="where to write the synthetic result folder (default: a temporary one)")
    parser.add_argument("--phase", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.phase:
        child(args)
        return
    temporary = args.folder is None
    folder = Path(tempfile.mkdtemp(prefix="agentload-summary-")) if temporary else Path(args.folder)
    try:
        print(f"{args.calls:,} calls, {args.calls // CALLS_PER_TASK:,} tasks")
        live = run_phase("live", args, folder)
        print(f"live tally     {live['seconds']:8.1f} s   peak {live['peak_mb']:8.1f} MB "
              f"({live['peak_mb'] - live['base_mb']:.1f} MB above the {live['base_mb']:.1f} MB of the interpreter "
              f"and imports)   {live['attempts']:,} attempts, {live['completed']:,} completed in the window")
        wrote = run_phase("write", args, folder)
        print(f"(wrote {wrote['bytes'] / 1e9:.2f} GB of records in {wrote['seconds']:.1f} s)")
        back = run_phase("rebuild", args, folder)
        print(f"read back      {back['seconds']:8.1f} s   peak {back['peak_mb']:8.1f} MB "
              f"({back['peak_mb'] - back['base_mb']:.1f} MB above {back['base_mb']:.1f} MB)   "
              f"{back['attempts']:,} attempts, {back['completed']:,} completed in the window")
        if args.list_calls:
            old = run_phase("list", args, folder)
            print(f"list-based ({args.list_calls:,} calls, {LIST_COMMIT}) {old['seconds']:8.1f} s   "
                  f"peak {old['peak_mb']:8.1f} MB ({old['peak_mb'] - old['base_mb']:.1f} MB above {old['base_mb']:.1f} MB)")
    finally:
        if temporary:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
