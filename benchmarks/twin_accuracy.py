"""How well the calibrated twin predicts a real vLLM server (CPU build, tiny model) on held-back agent traffic.

1. Start the real server (the tiny test model on vLLM's CPU build), or take `--target URL`.
2. Calibrate: `agentload calibrate` runs the fixed-shape sweep only (bursts of identical requests) and
   writes the calibrated profile (or take `--profile FILE` and skip this).
3. For each held-back scenario (scenarios/accuracy/*.yaml: token-scaled Claude Code sessions at two
   load levels, a bursty Azure sample) and each repeat: `agentload run` against the server, then
   `agentload simulate` of the same scenario and seed on the calibrated profile.
4. Print predicted vs measured for each figure with the ratio and the target band:
   output throughput ±10%, p50 and p95 task completion time ±10%, p95 TTFT ±15%.

Each repeat uses its own seed (printed), so its prompts share no prefix with an earlier run's still in
the server's prefix cache; the twin of that repeat simulates the same seed. The machine's load average
is printed before and after each real run: on a shared machine the server competes for the CPUs, which
the twin does not model.

    .venv/bin/python benchmarks/twin_accuracy.py                       # start a server, calibrate, compare
    .venv/bin/python benchmarks/twin_accuracy.py --target http://127.0.0.1:8000 --profile tiny-vllm-cpu
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AGENTLOAD = [sys.executable, "-m", "simulator"]
SCENARIOS = sorted((ROOT / "scenarios" / "accuracy").glob("*.yaml"))

FIGURES = (
    # (label, summary path, target band)
    ("output tok/s", ("output_throughput",), 0.10),
    ("task p50 s", ("tasks", "completion_time_s", "p50"), 0.10),
    ("task p95 s", ("tasks", "completion_time_s", "p95"), 0.10),
    ("TTFT p95 ms", ("p95_ttft_ms",), 0.15),
)
EXTRA = (
    ("TTFT p50 ms", ("p50_ttft_ms",)),
    ("TPOT p50 ms", ("p50_tpot_ms",)),
    ("cached prompt tokens", ("total_cached_tokens",)),
    ("client lag p99 ms", ("client_lag_ms", "p99")),
)


def load_average() -> str:
    try:
        return "/".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "n/a"


def agentload(args: list[str], log: Path) -> None:
    """Run one agentload command, printing it; its output goes to `log` (and the tail to stderr on failure)."""
    print("$ agentload " + " ".join(shlex.quote(a) for a in args), flush=True)
    with open(log, "w") as out:
        done = subprocess.run(AGENTLOAD + args, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        sys.stderr.write(log.read_text()[-4000:])
        raise SystemExit(f"agentload {args[0]} failed with exit code {done.returncode} (log: {log})")


def figure(summary: dict, path: tuple[str, ...]) -> float:
    value = summary
    for key in path:
        value = value[key]
    return float(value)


@contextlib.contextmanager
def server(args: argparse.Namespace):
    """The target URL: the one given, or a tiny-model vLLM server started for the benchmark."""
    if args.target:
        yield args.target.rstrip("/")
        return
    from simulator.live.vllm import VLLMServer, build_tiny_model

    model = Path(args.model_dir)
    if not (model / "config.json").exists():
        print(build_tiny_model(model), file=sys.stderr)
    with VLLMServer(model) as srv:
        print(f"vLLM up at {srv.base_url} after {srv.startup_seconds:.1f} s (log {srv.log_path})", flush=True)
        yield srv.base_url


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", help="a running server (default: start the tiny model on vLLM's CPU build)")
    parser.add_argument("--model-dir", default=str(ROOT / ".cache" / "agentload" / "tiny-llama"),
                        help="tiny model folder (built when missing)")
    parser.add_argument("--profile", help="use this profile (preset or YAML) instead of calibrating")
    parser.add_argument("--base-profile", default="tiny-vllm-cpu", help="base profile of the calibration")
    parser.add_argument("--calibrate-repeat", type=int, default=5)
    parser.add_argument("--statistic", default="median", choices=("min", "median"),
                        help="reduction of the calibration repeats")
    parser.add_argument("--scenario", action="append", help="scenario file(s) (default: scenarios/accuracy/*.yaml)")
    parser.add_argument("--repeat", type=int, default=2, help="real runs per scenario")
    parser.add_argument("--seed", type=int, help="seed of the first run (default: from the clock)")
    parser.add_argument("--output", default=str(ROOT / "results" / "twin-accuracy"), help="result folder")
    args = parser.parse_args()

    out = Path(args.output) / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    scenarios = [Path(s) for s in args.scenario] if args.scenario else SCENARIOS
    seed = args.seed if args.seed is not None else int(time.time()) % 1_000_000
    print(f"results in {out}; first seed {seed}; load average {load_average()}", flush=True)

    rows = []
    with server(args) as url:
        profile = args.profile
        if profile is None:
            profile = str(out / "tiny-vllm-cpu-calibrated.yaml")
            agentload(["calibrate", "-p", args.base_profile, "--target", url, "--vocab-size", "1024",
                       "--repeat", str(args.calibrate_repeat), "--statistic", args.statistic,
                       "-o", profile, "--name", "tiny-vllm-cpu"], out / "calibrate.log")
            print((out / "calibrate.log").read_text(), flush=True)
        for scenario in scenarios:
            measured, predicted = [], []
            for r in range(args.repeat):
                run_seed = seed + 1000 * len(rows) + r
                sets = ["--set", f"target.base_url={url}", "--set", f"run.seed={run_seed}"]
                real_dir, sim_dir = out / f"{scenario.stem}-real-{r}", out / f"{scenario.stem}-twin-{r}"
                before = load_average()
                agentload(["run", str(scenario), "-o", str(real_dir), "--no-progress", *sets],
                          out / f"{scenario.stem}-real-{r}.log")
                print(f"  load average before {before}, after {load_average()}", flush=True)
                agentload(["simulate", str(scenario), "-p", profile, "-o", str(sim_dir), *sets],
                          out / f"{scenario.stem}-twin-{r}.log")
                measured.append(json.loads((real_dir / "summary.json").read_text()))
                predicted.append(json.loads((sim_dir / "summary.json").read_text()))
            rows.append((scenario.stem, measured, predicted))

    report = []
    print(f"\nprofile {profile}; load average now {load_average()}")
    print(f"{'scenario':26s} {'figure':20s} {'twin':>10s} {'real (median)':>14s} {'real range':>19s} "
          f"{'twin/real':>9s}  target")
    for name, measured, predicted in rows:
        for label, path, band in FIGURES + tuple((l, p, None) for l, p in EXTRA):
            real = [figure(s, path) for s in measured]
            twin = statistics.mean(figure(s, path) for s in predicted)
            mid = statistics.median(real)
            ratio = twin / mid if mid else float("nan")
            verdict = "" if band is None else ("ok" if abs(ratio - 1) <= band else "MISS") + f" ±{band:.0%}"
            print(f"{name:26s} {label:20s} {twin:10.3f} {mid:14.3f} {min(real):9.3f}–{max(real):9.3f} "
                  f"{ratio:9.3f}  {verdict}")
            report.append({"scenario": name, "figure": label, "twin": twin, "real": real, "ratio": ratio,
                           "band": band})
    (out / "accuracy.json").write_text(json.dumps({"profile": profile, "rows": report}, indent=2))
    print(f"\nwrote {out / 'accuracy.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
