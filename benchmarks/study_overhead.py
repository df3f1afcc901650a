"""The study's own overhead per point, server start and stop aside (not a test; prints its figures).

A point's overhead is the time `agentload study` spends on it besides the run itself: applying the load
point to the workload, reading the finished point back (its summary, and its calls and tasks for the
API price and the task times), writing study-point.json. Two studies are timed:

- twin: scenarios/gb300-agents.yaml on two GB300 presets, a capacity search of one repeat each (points
  of ~15,000 calls and ~700 sessions, the heaviest records a point has to read back);
- emulator: the built-in emulator launched as a server, a sweep of short points (the study's own
  bookkeeping beside HTTP runs).

    .venv/bin/python benchmarks/study_overhead.py [--output DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from simulator.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[1]

TWIN = f"""\
name: overhead-twin
scenario: {ROOT / 'scenarios' / 'gb300-agents.yaml'}
slo: {{task_s: {{p50: 900}}, ttft_ms: {{p95: 2000}}}}
configs:
  base: {{name: default, profile: gb300-nemotron-super-default}}
  variants: [{{name: fp16-state, profile: gb300-nemotron-super-fp16-state}}]
capacity: {{low: 0.05, high: 0.2, precision: 0.1}}
"""

EMULATOR = f"""\
name: overhead-emulator
workload:
  synthetic: {{input_tokens: 64, output_tokens: 8, concurrency: 40, calls: 40}}
  stagger: 0.05
slo: {{task_s: {{p95: 2}}}}
configs:
  base:
    name: emu
    server: {{argv: [{sys.executable}, -m, simulator, serve-emulator, --port, "{{port}}", --ttft, "0.02", --itl, "0.005"]}}
load: {{axis: rate, range: {{start: 10, stop: 40, num: 6}}}}
repeats: 2
"""


def measure(name: str, text: str, folder: Path) -> None:
    path = folder / f"{name}.yaml"
    path.write_text(text)
    began = time.perf_counter()
    code = cli_main(["study", str(path), "-o", str(folder / name)])
    wall = time.perf_counter() - began
    study = json.loads((folder / name / "study.json").read_text())
    points = [p for c in study["configs"] for p in c["points"]]
    overhead = [p["overhead_s"] for p in points]
    runs = sum(p["run_s"] for p in points)
    starts = sum((c["server"] or {}).get("startup_s") or 0.0 for c in study["configs"])
    print(f"{name}: exit {code}; {len(points)} points in {wall:.1f} s (runs {runs:.1f} s, server starts "
          f"{starts:.1f} s); overhead per point: mean {statistics.fmean(overhead):.3f} s, "
          f"median {statistics.median(overhead):.3f} s, max {max(overhead):.3f} s", file=sys.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", help="folder for the two studies (default: a temporary one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(args.output or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        measure("twin", TWIN, folder)
        measure("emulator", EMULATOR, folder)


if __name__ == "__main__":
    main()
