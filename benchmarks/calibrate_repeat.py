"""Does `agentload calibrate` pass against a fresh real vLLM server, time after time?

Starts the tiny test model on vLLM's CPU build (the project's launcher, `simulator.live.vllm`; the model
is built first when its folder has none) and runs

    agentload calibrate -p tiny-vllm-cpu --target URL --vocab-size 1024 [--repeat R] [short sweep]

`--runs` times (10 by default), on a fresh server for every run (`--fresh-every 1`, the default) or one
server for every few runs. For each run it prints whether it passed (exit code 0, no traceback), the
fit's rms relative error and its points, the points the calibration skipped (no round measured them)
and the measurements it missed, the run's time and the machine's load average; then "passed k of N",
and in how many runs the fit came within `--rms-limit` (a run can pass with a fit that went astray).
Each run's stdout and stderr are kept in the output folder.

One full calibration (55 points, `--repeat 3`, the command's default) took 7 min 31 s on the 2-vCPU
test machine shared with other work (load average 3 to 4), and a server 20 to 30 s to start: ten runs,
80 minutes. `--short` measures a shorter sweep that keeps the prefill bursts and five loaded points
(`--max-prompt 1100 --max-concurrency 17`: 35 points, none of the big decode batches): 1.5 to 3.5
minutes a run there; `--repeat` sets the rounds.

    .venv/bin/python benchmarks/calibrate_repeat.py                     # ten full calibrations
    .venv/bin/python benchmarks/calibrate_repeat.py --short --repeat 1 --fresh-every 2
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

ROOT = Path(__file__).resolve().parents[1]
AGENTLOAD = [sys.executable, "-m", "simulator"]
SHORT_SWEEP = ("--max-prompt", "1100", "--max-concurrency", "17")
"""The short sweep: prompts up to 1,100 tokens and batches up to 17 keep the prefill bursts (4 and 16
requests) and the loaded points of 8 and 16 streams, and leave out the long decode batches."""
RMS = re.compile(r"rms relative error over (\d+) points: ([0-9.]+%)")
SKIPPED = re.compile(r"^skipped (\d+) of (\d+) points")


def load_average() -> str:
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "n/a"


def minutes(seconds: float) -> str:
    whole = int(round(seconds))
    return f"{whole // 60} min {whole % 60:02d} s"


def calibrate(url: str, args: argparse.Namespace, log: Path) -> dict:
    """One calibration against `url`; what it printed, read back: pass, rms, points, skips, misses."""
    command = AGENTLOAD + ["calibrate", "-p", "tiny-vllm-cpu", "--target", url, "--vocab-size", "1024",
                           "--repeat", str(args.repeat), *(SHORT_SWEEP if args.short else ())]
    began = time.monotonic()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    seconds = time.monotonic() - began
    log.with_suffix(".out").write_text(done.stdout)
    log.with_suffix(".err").write_text(done.stderr)
    rms = RMS.search(done.stdout)
    lines = done.stdout.splitlines()
    skipped: list[str] = []
    for k, line in enumerate(lines):
        if SKIPPED.match(line):
            skipped = [entry.strip() for entry in lines[k + 1:] if entry.startswith("  ")]
    traceback = "Traceback" in done.stderr
    error = next((line for line in done.stderr.splitlines() if line.startswith("agentload: error:")), None)
    return {
        "passed": done.returncode == 0 and not traceback,
        "code": done.returncode,
        "traceback": traceback,
        "error": error,
        "rms": rms.group(2) if rms else None,
        "points": int(rms.group(1)) if rms else None,
        "skipped": skipped,
        "missed": sum(1 for line in done.stderr.splitlines() if "not measured in round" in line),
        "seconds": seconds,
    }


def describe(n: int, runs: int, result: dict, load_before: str) -> str:
    head = f"run {n} of {runs}: {'passed' if result['passed'] else 'FAILED'}"
    if result["rms"] is not None:
        head += f", rms error {result['rms']} over {result['points']} points"
    head += f", skipped: {len(result['skipped'])} point(s), missed measurements: {result['missed']}"
    head += f", {minutes(result['seconds'])} (load average {load_before} before, {load_average()} after)"
    lines = [head] + [f"    skipped {entry}" for entry in result["skipped"]]
    if not result["passed"]:
        lines.append(f"    exit code {result['code']}" + (", with a traceback" if result["traceback"] else "")
                     + (f": {result['error']}" if result["error"] else ""))
    return "\n".join(lines)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10, help="calibrations to run (default 10)")
    parser.add_argument("--fresh-every", type=int, default=1,
                        help="start a fresh server every this many runs (default 1: every run)")
    parser.add_argument("--repeat", type=int, default=3, help="calibrate's --repeat (default 3, its own default)")
    parser.add_argument("--short", action="store_true", help="the short sweep (SHORT_SWEEP) instead of the full one")
    parser.add_argument("--rms-limit", type=float, default=0.20,
                        help="a fit's rms relative error counted as good up to this (default 0.20)")
    parser.add_argument("--model-dir", default=str(ROOT / ".cache" / "agentload" / "tiny-llama"),
                        help="the tiny model's folder (built there when absent)")
    parser.add_argument("--output", default=str(ROOT / "results" / "calibrate-repeat" / time.strftime("%Y%m%d-%H%M%S")),
                        help="folder for each run's stdout and stderr")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.fresh_every < 1 or args.repeat < 1:
        parser.error("--runs, --fresh-every and --repeat must be at least 1")

    from simulator.live.vllm import VLLMServer
    from tiny_vllm import ensure_model

    model = ensure_model(Path(args.model_dir))
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    sweep = "short sweep " + " ".join(SHORT_SWEEP) if args.short else "full sweep"
    print(f"{args.runs} calibrations, {sweep}, --repeat {args.repeat}, a fresh server every "
          f"{args.fresh_every} run(s); logs in {out}", flush=True)
    passed = good = 0
    server: Optional[VLLMServer] = None
    try:
        for n in range(1, args.runs + 1):
            if server is None or (n - 1) % args.fresh_every == 0:
                if server is not None:
                    server.stop()
                server = VLLMServer(model, log_path=out / f"server-{n}.log")
                server.start()
                print(f"vLLM up at {server.base_url} after {server.startup_seconds:.1f} s", flush=True)
            load_before = load_average()
            result = calibrate(server.base_url, args, out / f"run-{n}")
            passed += result["passed"]
            good += result["passed"] and result["rms"] is not None and float(result["rms"][:-1]) <= 100 * args.rms_limit
            print(describe(n, args.runs, result, load_before), flush=True)
    finally:
        if server is not None:
            server.stop()
    print(f"passed {passed} of {args.runs}; fit within {args.rms_limit:.0%} rms in {good} of {args.runs}")
    return 0 if passed == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
