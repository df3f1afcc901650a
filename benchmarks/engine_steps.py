"""The real engine's steps against the twin's step-time model, one step at a time.

The held-out benchmark (`twin_accuracy.py`) compares end results; this looks inside. It starts the tiny
model on vLLM's CPU build with a hook on the engine (`engine_step_hook/sitecustomize.py`) that records
every step: when it began, how long it took, the CPU and system time the engine thread used and the page
faults it took, and what it computed (tokens and context of each request). It calibrates a profile on
that server (or takes `--profile`), runs a scenario `--repeat` times, and prints:

- per kind of step (pure decode by batch size, prefills alone, prefills mixed with decodes, by prefill
  tokens): how many, their time on the server and on the profile's step-time model for the same
  batches (the twin's own step arithmetic, `per_new_shape` for a token count not among the last
  `shape_cache` and `idle_wake` after a pause included), the ratio of the sums and the median of
  the per-step ratios;
- per run: the engine's system time and page faults, the time its thread was off the CPU during steps
  (their wall time less its CPU time: other processes ran), and its steps that took more than twice the
  model;
- decode steps after a step where a request completed its prompt, where requests ended, and neither:
  their median time and the engine thread's CPU time over the model without `batch_join` and
  `batch_leave`, which are what those settings should be on this server.

A median ratio near 1 with a sum ratio well below it means the step model is right for the usual step
and the server has outliers the twin does not; a median ratio off 1 means the model is off for that
kind of step.

    .venv/bin/python benchmarks/engine_steps.py                                   # azure-bursty, 3 runs
    .venv/bin/python benchmarks/engine_steps.py --scenario scenarios/accuracy/claude-code-high.yaml --profile CAL.yaml
    .venv/bin/python benchmarks/engine_steps.py --profile CAL.yaml --glibc      # the server on glibc's malloc
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import simpy

from simulator.live.vllm import VLLMServer
from simulator.sim.make_twin import make_twin
from simulator.sim.profile import load_profile
from tiny_vllm import ensure_model

ROOT = Path(__file__).resolve().parents[1]
HOOK = Path(__file__).resolve().parent / "engine_step_hook"
AGENTLOAD = [sys.executable, "-m", "simulator"]


def read_steps(log: Path) -> list[tuple[float, float, float, float, int, list[tuple[int, int]]]]:
    """Every step the hook wrote (all of the server's processes): (start, seconds, thread CPU seconds,
    thread system seconds, page faults, [(tokens, computed before)] per request), by start."""
    steps = []
    for path in log.parent.glob(log.name + ".*"):
        for line in path.read_text().splitlines():
            start, seconds, cpu, system, faults, *scheduled = line.split()
            steps.append((float(start), float(seconds), float(cpu), float(system), int(faults),
                          [tuple(map(int, pair.split("@")[0].split(":"))) for pair in scheduled]))
    return sorted(steps)


def kind(decodes: int, prefills: int, prefill_tokens: int) -> str:
    """The row a step counts in."""
    if not prefills:
        size = "1" if decodes == 1 else "2-4" if decodes <= 4 else "5-16" if decodes <= 16 else "17+"
        return f"decode, {size} seqs"
    tokens = "<512" if prefill_tokens < 512 else "512-1535" if prefill_tokens < 1536 else "1536+"
    if decodes:
        return f"mixed, {tokens} prefill tokens"
    return f"prefill alone, {'1 seq' if prefills == 1 else '2+ seqs'}, {tokens} tokens"


def changes(before, step) -> tuple[bool, bool]:
    """Whether, in the step `before` this one, a request completed its prompt and decodes now, and
    whether requests ended there (a request continues at the tokens it had plus those it computed)."""
    went_on = {c + n for n, c in before[5]}
    now = {c for _, c in step[5]}
    began = any(n > 1 and c + n in now for n, c in before[5])
    ended = sum(1 for _, c in step[5] if c in went_on) < len(before[5])
    return began, ended


def modelled(steps, profile) -> list[tuple[str, float]]:
    """Each step's kind and what the twin of `profile` charges for the same batch: its step time
    (`Twin._duration`), a new step size (`Twin._known_shape`, its shape cache carried from step to step),
    waking after a pause, and requests joining and leaving the batch in the step before."""
    twin = make_twin(simpy.Environment(), profile, fast_decode=False)  # never run: only its step arithmetic
    st = profile.step_time
    out = []
    previous_end = None
    for i, (start, seconds, _, _, _, scheduled) in enumerate(steps):
        # a request computing one token after others is decoding; anything else is a prefill chunk
        decodes = [SimpleNamespace(computed=c) for n, c in scheduled if n == 1 and c > 0]
        prefills = [(SimpleNamespace(computed=c), n) for n, c in scheduled if not (n == 1 and c > 0)]
        duration = twin._duration(decodes, prefills)
        prefill_tokens = sum(n for _, n in prefills)
        if not twin._known_shape(prefill_tokens + len(decodes)):
            duration += st.per_new_shape
        if previous_end is not None and start - previous_end > st.idle_after:
            duration += st.idle_wake
        if i:
            began, ended = changes(steps[i - 1], steps[i])
            duration += st.batch_join * began + st.batch_leave * ended
        previous_end = start + seconds
        out.append((kind(len(decodes), len(prefills), prefill_tokens), duration))
    return out


def report(steps, model, windows: list[tuple[float, float]]) -> None:
    """The tables (see the module's docstring) for the steps inside the runs' windows."""
    rows = defaultdict(list)
    per_run = [[] for _ in windows]
    for step, (row, predicted) in zip(steps, model):
        for i, (low, high) in enumerate(windows):
            if low <= step[0] <= high:
                rows[row].append((step[1], predicted))
                per_run[i].append((step, predicted))
    print(f"\n{'kind of step':40s} {'steps':>6s} {'server s':>9s} {'model s':>9s} {'sum ratio':>10s} {'median ratio':>13s}")
    for row in sorted(rows):
        real, predicted = np.array(rows[row]).T
        print(f"{row:40s} {len(real):6d} {real.sum():9.3f} {predicted.sum():9.3f} {predicted.sum() / real.sum():10.2f}"
              f" {np.median(predicted / real):13.2f}")
    print("\n(ratios: model / server)")
    for i, run in enumerate(per_run):
        if not run:
            continue
        system = sum(s[3] for s, _ in run)
        faults = sum(s[4] for s, _ in run)
        off_cpu = sum(max(0.0, s[1] - s[2]) for s, _ in run)
        slow = [(s, p) for s, p in run if s[1] > 2 * p]
        lost = sum(s[1] - p for s, p in slow)
        print(f"run {i}: {len(run)} steps, {sum(s[1] for s, _ in run):.2f} s, engine system time {system * 1e3:.0f} ms, "
              f"{faults} page faults, {off_cpu * 1e3:.0f} ms off the CPU (other processes ran); {len(slow)} steps "
              f"over twice the model ({lost * 1e3:.0f} ms beyond it)")
        for s, p in sorted(slow, key=lambda sp: sp[1] - sp[0][1])[:5]:
            print(f"    {s[1] * 1e3:7.1f} ms (model {p * 1e3:6.1f}): CPU {s[2] * 1e3:6.1f} ms of which system {s[3] * 1e3:6.1f},"
                  f" {s[4]} faults, {sum(n for n, _ in s[5])} tokens over {len(s[5])} requests")


def churn(steps, model, profile, windows: list[tuple[float, float]]) -> None:
    """Pure decode steps by what changed in the step before: a request began decoding, requests
    ended, or neither; the median time over the model without `batch_join` and `batch_leave` (what
    those settings should be), and the engine thread's CPU time over it."""
    st = profile.step_time
    groups = defaultdict(list)
    for before, step, (_, predicted) in zip(steps, steps[1:], model[1:]):
        if not any(low <= step[0] <= high for low, high in windows) \
                or not all(n == 1 and c > 0 for n, c in step[5]):
            continue
        began, ended = changes(before, step)
        predicted -= st.batch_join * began + st.batch_leave * ended
        key = "a request began decoding" if began else "requests ended" if ended else "neither"
        groups[key].append((step[1] - predicted, min(step[2], step[1]) - predicted))
    print(f"\n{'decode steps after a step where':34s} {'steps':>6s} {'time over model':>16s} {'CPU over model':>15s}  (medians)")
    for key in ("neither", "a request began decoding", "requests ended"):
        if groups[key]:
            wall, cpu = np.median(np.array(groups[key]), axis=0)
            print(f"{key:34s} {len(groups[key]):6d} {wall * 1e3:13.3f} ms {cpu * 1e3:12.3f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenario", default=str(ROOT / "scenarios" / "accuracy" / "azure-bursty.yaml"))
    parser.add_argument("--profile", help="the step-time model to compare with (default: calibrate this server)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of the scenario")
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100000 * 10)
    parser.add_argument("--model-dir", default=str(ROOT / ".cache" / "agentload" / "tiny-llama"))
    parser.add_argument("--output", default=str(ROOT / "results" / "engine-steps"), help="result folder")
    parser.add_argument("--glibc", action="store_true", help="run the server on glibc's allocator, not TCMalloc")
    args = parser.parse_args()
    out = Path(args.output) / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True)
    model_dir = ensure_model(Path(args.model_dir))
    log = out / "steps"
    path = os.pathsep.join(p for p in (str(HOOK), os.environ.get("PYTHONPATH", "")) if p)
    env = {"PYTHONPATH": path, "AGENTLOAD_STEP_LOG": str(log)}
    with VLLMServer(model_dir, env=env, log_path=out / "server.log", tcmalloc=not args.glibc) as server:
        print(f"vLLM up at {server.base_url}; steps recorded in {log}.<pid>", flush=True)
        profile = args.profile
        if profile is None:
            profile = str(out / "calibrated.yaml")
            subprocess.run(AGENTLOAD + ["calibrate", "-p", "tiny-vllm-cpu", "--target", server.base_url,
                                        "--vocab-size", "1024", "--repeat", "5", "-o", profile], check=True)
        windows = []
        for i in range(args.repeat):
            began = time.time()
            subprocess.run(AGENTLOAD + ["run", args.scenario, "-o", str(out / f"run-{i}"), "--no-progress",
                                        "--set", f"target.base_url={server.base_url}",
                                        "--set", f"run.seed={args.seed + i}"], check=True, stdout=subprocess.DEVNULL)
            windows.append((began, time.time()))
    steps = read_steps(log)
    if not steps:
        raise SystemExit(f"no steps recorded in {log}.*: the hook did not load (see {out / 'server.log'})")
    print(f"{len(steps)} steps recorded; profile {profile}")
    profile = load_profile(profile)
    model = modelled(steps, profile)
    report(steps, model, windows)
    churn(steps, model, profile, windows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
