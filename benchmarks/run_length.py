"""How close `agentload run`'s run-length estimate (the banner's "run of about / at least ...") comes to
the run's real length, on every shipped scenario (scenarios/*.yaml, scenarios/accuracy/*.yaml,
scenarios/vllm/*.yaml).

For each scenario it prints the estimate (`simulator.live.run_length.scenario_run_length`, exactly what
the banner says), the run's length, how that length was got, and their ratio (estimate / length). A
run's length is from the start of its arrivals to the end of its last task (sub-agents included),
read from tasks.jsonl of its result folder. It is got:

- ``live``: `agentload run` of the scenario: against the built-in emulator when the scenario has no
  target, against the vLLM server of `--target URL` (or one started here: the tiny test model on
  vLLM's CPU build) when it has one;
- ``twin``: `agentload simulate` instead, where a live run would take too long (`--max-live`):
  on the emulator's profile when it names one, otherwise on a twin profile built from the emulator's
  batched timing (steps of ``decode_base + decode_per_seq x running + prefill_per_token x uncached
  prompt tokens``, whole prompts admitted, every sequence up to ``max_num_seqs``: what `BatchTiming`
  does); against a real server, on `--profile` (default tiny-vllm-cpu, the test server's twin) when
  no server runs (`--no-server`).

Against the emulator the estimate counts each call's time on the idle emulator, so it should come
within 20% of the run; against a real server it counts no server time at all (agentload does not
know the server's speed before the run) and is a lower bound, as the banner says.

    .venv/bin/python benchmarks/run_length.py                      # every scenario, vLLM started here
    .venv/bin/python benchmarks/run_length.py --target http://127.0.0.1:8000
    .venv/bin/python benchmarks/run_length.py --no-server          # real-target scenarios on the twin
    .venv/bin/python benchmarks/run_length.py scenarios/quickstart.yaml --also-twin
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import yaml

from simulator import scenario as sc
from simulator.live.run_length import scenario_run_length
from simulator.metrics import results
from simulator.workload import describe_seconds
from tiny_vllm import served

ROOT = Path(__file__).resolve().parents[1]
AGENTLOAD = [sys.executable, "-m", "simulator"]
SCENARIOS = [*sorted((ROOT / "scenarios").glob("*.yaml")), *sorted((ROOT / "scenarios" / "accuracy").glob("*.yaml")),
             *sorted((ROOT / "scenarios" / "vllm").glob("*.yaml"))]


def measured_length(folder: Path) -> float:
    """Seconds from the run's start to the end of its last task (tasks.jsonl)."""
    return max((task.end for task in results.iter_tasks(folder)), default=0.0)


def batched_profile(settings, path: Path) -> Path:
    """A twin profile that steps as the emulator's batched timing does (written to `path`)."""
    data = {
        "name": "emulator-batched",
        "description": "the built-in emulator's batched timing as a twin profile (benchmarks/run_length.py)",
        "scheduler": {"max_num_seqs": settings.max_num_seqs, "chunked_prefill": False,
                      "max_num_batched_tokens": settings.max_model_len * settings.max_num_seqs,
                      "max_model_len": settings.max_model_len},
        "kv_cache": {"block_size": settings.block_size, "num_blocks": settings.cache_blocks,
                     "enable_prefix_caching": True},
        "step_time": {"fixed": settings.decode_base, "per_decode_seq": settings.decode_per_seq,
                      "per_prefill_token": settings.prefill_per_token},
    }
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def agentload(*args: str) -> float:
    """Run an agentload command; returns its wall seconds (raises when it fails)."""
    start = time.perf_counter()
    proc = subprocess.run([*AGENTLOAD, *args], cwd=ROOT, capture_output=True, text=True)
    if proc.returncode not in (0, 1, 4):  # failed calls (1) or a missed SLO (4) still measured the run
        raise RuntimeError(f"agentload {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
    return time.perf_counter() - start


def vllm_server(args: argparse.Namespace) -> contextlib.AbstractContextManager[Optional[str]]:
    """The real server's URL: `--target`, one started here, or None (`--no-server`)."""
    return contextlib.nullcontext(None) if args.no_server else served(args.target, Path(args.model_dir))


def measure(path: Path, scenario, estimate: float, url: Optional[str], args: argparse.Namespace,
            work: Path) -> list[tuple[str, float]]:
    """(how, seconds) of the scenario's run: live where it can be, on the twin where asked or needed."""
    out: list[tuple[str, float]] = []
    name = path.stem
    live = scenario.target is None or url is not None
    if live and estimate <= args.max_live:
        folder = work / f"{path.parent.name}-{name}-live"
        extra = ["--set", f"target.base_url={url}"] if scenario.target is not None else []
        agentload("run", str(path), "-o", str(folder), "--no-progress", *extra)
        out.append(("live", measured_length(folder)))
    if not out or args.also_twin:
        if scenario.target is not None:
            profile, label = args.profile, f"twin of {args.profile}"
        elif scenario.emulator.profile:
            profile = scenario.emulator.profile
            label = f"twin of {profile}"
        else:
            profile = str(batched_profile(scenario.emulator, work / f"{name}-batched.yaml"))
            label = "twin of the emulator's batched timing"
        folder = work / f"{path.parent.name}-{name}-twin"
        agentload("simulate", str(path), "-p", profile, "-o", str(folder))
        out.append((label, measured_length(folder)))
    return out


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenarios", nargs="*", type=Path, help="scenario files (default: every shipped one)")
    parser.add_argument("--target", help="a running vLLM server for the scenarios with a target")
    parser.add_argument("--no-server", action="store_true",
                        help="start no vLLM server: scenarios with a target are simulated on --profile")
    parser.add_argument("--profile", default="tiny-vllm-cpu", help="twin of the real server (default tiny-vllm-cpu)")
    parser.add_argument("--model-dir", default=str(ROOT / ".cache" / "agentload" / "tiny-llama"),
                        help="the tiny model's folder (built there when missing)")
    parser.add_argument("--max-live", type=float, default=600.0,
                        help="simulate instead of running live when the estimate is longer (seconds; default 600)")
    parser.add_argument("--also-twin", action="store_true", help="simulate each scenario too, beside its live run")
    parser.add_argument("--keep", type=Path, help="keep the result folders here (default: a temporary folder)")
    args = parser.parse_args(argv)

    paths = [p.resolve() for p in args.scenarios] or SCENARIOS
    work = args.keep or Path(tempfile.mkdtemp(prefix="agentload-run-length-"))
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    needs_server = any(sc.load(p).target is not None for p in paths)
    with (vllm_server(args) if needs_server else contextlib.nullcontext(None)) as url:
        for path in paths:
            scenario = sc.load(path)
            workload = sc.load_workload(scenario)
            length = scenario_run_length(scenario, workload)
            kind = "emulator" if scenario.target is None else "server"
            for how, seconds in measure(path, scenario, length.estimate, url, args, work):
                rows.append((str(path.relative_to(ROOT)), kind, length.estimate, length.server_time, how, seconds))
                print(f"  {rows[-1][0]}: estimate {length.estimate:,.1f} s, {how} {seconds:,.1f} s", flush=True)
    if args.keep is None:
        shutil.rmtree(work, ignore_errors=True)

    print()
    head = f"{'scenario':<42} {'target':<8} {'estimate':>12} {'run':>12} {'ratio':>6}  how"
    print(head)
    print("-" * len(head))
    for name, kind, estimate, counted, how, seconds in rows:
        ratio = f"{estimate / seconds:.2f}" if seconds > 0 else "-"
        bound = "" if counted else " (no server time: a lower bound)"
        print(f"{name:<42} {kind:<8} {describe_seconds(estimate):>12} {describe_seconds(seconds):>12} {ratio:>6}  "
              f"{how}{bound}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
