"""How long the HTML report of a 100k-call run takes to build, and how big the page is (targets: under
10 s, under 5 MB).

The result folder is a real one: `agentload simulate` of scenarios/gb300-agents.yaml on the default
GB300 preset with 6.4 hours of session arrivals instead of one (about 108,000 calls, 4,700 sessions,
sub-agents), made once and kept, with the twin's /metrics sampled every simulated second into
server_metrics.jsonl as a live run scrapes vLLM's (about 89,000 samples). Then it times, in a fresh
process each, the command a user types:

    agentload report DIR --html OUT          (the page)
    agentload report DIR --png OUT_DIR       (the same figures as PNG)

and prints the wall and CPU time of each (the CPU time is what a busy shared machine does not
inflate), the page's size, and the folder's counts.

    .venv/bin/python benchmarks/report_speed.py [--folder DIR] [--repeats N]
"""

from __future__ import annotations

import argparse
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
    """The simulated run (about a minute of simulation), the twin sampled every simulated second."""
    print(f"simulating {SCENARIO.name} with {ARRIVAL_SECONDS} s of arrivals on {PROFILE} into {folder} ...",
          flush=True)
    took, _ = agentload("simulate", str(SCENARIO), "-p", PROFILE, "-o", str(folder), "--approx-itl",
                        "--set", f"workload.generate.duration={ARRIVAL_SECONDS}", "--set", "run.scrape_interval=1")
    print(f"  simulated in {took:.1f} s", flush=True)


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
    if not (args.folder / "summary.json").exists() or not (args.folder / "server_metrics.jsonl").exists():
        make_folder(args.folder)  # a folder kept from before simulations sampled their twin is made again
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
