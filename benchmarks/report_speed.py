"""How long the HTML report of a 100k-call run takes to build, and how big the page is (targets: under
10 s, under 5 MB).

The result folder is a real one: `agentload simulate` of scenarios/gb300-agents.yaml on the default
GB300 preset with 6.4 hours of session arrivals instead of one (about 108,000 calls, 4,700 sessions,
sub-agents), made once and kept. A simulation has no server /metrics, so the benchmark adds a
server_metrics.jsonl as a live run against vLLM would write it: one scrape a second over the whole
run (about 89,000 scrapes), its gauges following the calls in flight. Then it times, in a fresh
process each, the command a user types:

    agentload report DIR --html OUT          (the page)
    agentload report DIR --png OUT_DIR       (the same figures as PNG)

and prints the wall and CPU time of each (the CPU time is what a busy shared machine does not
inflate), the page's size, and the folder's counts.

    .venv/bin/python benchmarks/report_speed.py [--folder DIR] [--repeats N]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SCENARIO = REPO / "scenarios" / "gb300-agents.yaml"
PROFILE = "gb300-nemotron-super-default"
ARRIVAL_SECONDS = 23_000
DEFAULT_FOLDER = REPO / ".cache" / "agentload" / "report-speed-100k"
TARGET_S, TARGET_MB = 10.0, 5.0


def agentload(*argv: str) -> tuple[float, float]:
    """Run an agentload command in a fresh process; (wall seconds, CPU seconds of the process). On a
    machine shared with other work the CPU seconds are the figure that does not depend on the others."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "simulator", *argv], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - started
    if done.returncode:
        sys.exit(f"agentload {' '.join(argv)} failed ({done.returncode}): {done.stderr}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def make_folder(folder: Path) -> None:
    """The simulated run (about a minute of simulation) and its synthesized /metrics scrapes."""
    print(f"simulating {SCENARIO.name} with {ARRIVAL_SECONDS} s of arrivals on {PROFILE} into {folder} ...",
          flush=True)
    took, _ = agentload("simulate", str(SCENARIO), "-p", PROFILE, "-o", str(folder), "--approx-itl",
                     "--set", f"workload.generate.duration={ARRIVAL_SECONDS}")
    print(f"  simulated in {took:.1f} s", flush=True)
    write_scrapes(folder)


def write_scrapes(folder: Path) -> None:
    """server_metrics.jsonl: a scrape every second, gauges from the calls in flight, counters growing."""
    from simulator.metrics import results

    sends, ends, prompts, cached = [], [], [], []
    for call in results.iter_calls(folder):
        sends.append(call.actual_send)
        ends.append(call.end)
        prompts.append(call.input_tokens)
        cached.append(call.cached_tokens or 0)
    sends, ends = np.array(sends), np.array(ends)
    order = np.argsort(sends)
    prompt_total, cached_total = np.cumsum(np.array(prompts)[order]), np.cumsum(np.array(cached)[order])
    ends_sorted = np.sort(ends)
    with open(folder / "server_metrics.jsonl", "w", encoding="utf-8") as fh:
        for t in np.arange(0.0, float(ends.max()) + 1.0, 1.0):
            started = int(np.searchsorted(sends[order], t, side="right"))
            in_flight = started - int(np.searchsorted(ends_sorted, t, side="right"))
            running = min(in_flight, 256)
            sample = {"t": float(t), "num_requests_running": float(running),
                      "num_requests_waiting": float(in_flight - running),
                      "kv_cache_usage_perc": min(1.0, in_flight / 300.0),
                      "prefix_cache_queries": float(prompt_total[started - 1]) if started else 0.0,
                      "prefix_cache_hits": float(cached_total[started - 1]) if started else 0.0}
            fh.write(json.dumps(sample) + "\n")


def counts(folder: Path) -> str:
    calls = sum(1 for _ in open(folder / "calls.jsonl", encoding="utf-8"))
    tasks = sum(1 for _ in open(folder / "tasks.jsonl", encoding="utf-8"))
    scrapes = sum(1 for _ in open(folder / "server_metrics.jsonl", encoding="utf-8"))
    return f"{calls:,} calls, {tasks:,} tasks (sub-agents too), {scrapes:,} /metrics scrapes"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--folder", type=Path, default=DEFAULT_FOLDER, help="the 100k-call result folder (made when missing)")
    parser.add_argument("--repeats", type=int, default=3, help="times each report is built (the median is the figure)")
    args = parser.parse_args()
    if not (args.folder / "summary.json").exists():
        make_folder(args.folder)
    elif not (args.folder / "server_metrics.jsonl").exists():
        write_scrapes(args.folder)
    print(f"result folder {args.folder}: {counts(args.folder)}")
    print(f"load average before: {', '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as tmp:
        page = Path(tmp) / "report.html"
        html = [agentload("report", str(args.folder), "--html", str(page)) for _ in range(args.repeats)]
        png = [agentload("report", str(args.folder), "--png", str(Path(tmp) / "png")) for _ in range(args.repeats)]
        size_mb = page.stat().st_size / 1e6
    ok = True
    for name, runs in (("--html", html), ("--png ", png)):
        wall, cpu = float(np.median([w for w, _ in runs])), float(np.median([c for _, c in runs]))
        print(f"agentload report {name}: {wall:.2f} s wall, {cpu:.2f} s CPU (medians of {len(runs)}: wall "
              f"{', '.join(f'{w:.2f}' for w, _ in runs)}; target < {TARGET_S:g} s)")
        ok &= min(wall, cpu) < TARGET_S
    print(f"page: {size_mb:.2f} MB (target < {TARGET_MB:g} MB)")
    ok &= size_mb < TARGET_MB
    print("targets met" if ok else "TARGETS MISSED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
