"""How many finished calls a run killed outright (SIGKILL) loses: those the server had answered in full
that never reached calls.jsonl. Records are pushed to the operating system within 100 ms of their end
(`simulator.metrics.results.ResultWriter`), so the loss is about 100 ms of calls at most.

An emulator runs in a child process (fixed timing); `agentload run` replays a steady stream of short
calls against it in another. Once the run has recorded `--after` calls, the benchmark reads the
emulator's counters, kills the run at once, and compares: calls the server had finished (requests
less the streams still open, less the preflight's) against the complete lines of calls.jsonl.

    .venv/bin/python benchmarks/kill_loss.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from reliability_helpers import EmulatorChild, free_port, lines, run_cli, scenario_file, wait_for, workload  # noqa: E402


def once(folder: Path, after: int) -> dict:
    server = EmulatorChild(free_port(), "--ttft", "0.002", "--itl", "0.002").start()
    try:
        load = workload(tasks=40, calls=200, out=8, gap=0.0, every=0.01, subtasks=False)
        scen = scenario_file(folder, f"target: {{base_url: '{server.url}'}}\n", load)
        out = folder / "result"
        proc = run_cli("run", str(scen), "-o", str(out), "--no-progress")
        wait_for(lambda: lines(out / "calls.jsonl") >= after, proc=proc)
        stats = server.stats()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        info = json.loads((out / "run.json").read_text())
        finished = stats["requests"] - stats["active_streams"] - info["preflight"]["tries"]
        recorded = lines(out / "calls.jsonl")
        rate = recorded / max(1e-9, (out / "calls.jsonl").stat().st_mtime - (out / "run.json").stat().st_mtime)
        return {"finished": finished, "recorded": recorded, "lost": max(0, finished - recorded), "calls_per_s": rate}
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--after", type=int, default=2000, help="recorded calls before the kill")
    args = parser.parse_args()
    losses, rates = [], []
    for i in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="agentload-kill-") as tmp:
            result = once(Path(tmp), args.after)
        losses.append(result["lost"])
        rates.append(result["calls_per_s"])
        print(f"run {i + 1}: server finished {result['finished']} calls, calls.jsonl holds {result['recorded']}, "
              f"lost {result['lost']} (~{1000 * result['lost'] / result['calls_per_s']:.0f} ms of calls at "
              f"{result['calls_per_s']:.0f} calls/s)")
    worst = max(losses)
    print(f"lost per kill: median {statistics.median(losses):g}, max {worst} calls "
          f"(~{1000 * worst / statistics.median(rates):.0f} ms of calls)")


if __name__ == "__main__":
    main()
