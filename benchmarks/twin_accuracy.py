"""How well the calibrated twin predicts a real vLLM server (CPU build, tiny model) on held-back agent traffic.

1. Start the real server (the tiny test model on vLLM's CPU build), or take `--target URL`.
2. Calibrate: `agentload calibrate` runs the fixed-shape sweep only (bursts of identical requests) and
   writes the calibrated profile (or take `--profile FILE` and skip this).
3. For each held-back scenario (scenarios/accuracy/*.yaml: token-scaled Claude Code sessions at two
   load levels, a bursty Azure sample, bursts of long Mooncake prompts) and each repeat: `agentload run` against the server, then
   `agentload simulate` of the same scenario and seed on the calibrated profile.
4. Print predicted vs measured for each figure with the ratio and the target band:
   output throughput ±10%, p50 and p95 task completion time ±10%, p95 TTFT ±15%.

Each repeat uses its own seed (printed), so its prompts share no prefix with an earlier run's still in
the server's prefix cache; the twin of that repeat simulates the same seed. Before each real run a
reference request of the calibration sweep (a cold 1024-token prefill) is timed again and printed
against the calibrated profile's figure for it, with the machine's load average and the CPU time the
hypervisor stole during the run: on a shared machine the server competes for the CPUs, which the twin
does not model, and a shared host's speed drifts. The repeats go round the scenarios so that a drift
reaches them all alike. The real figure compared is
taken over all repeats (five by default) together: percentiles of their merged histograms, the median
of the runs for throughput. A p95 of one short run rests on its few slowest calls, which move with
chance coincidences of arrivals and steps; pooling the repeats steadies it. On the 2-vCPU test machine
one run's task p95 lay from 13% below to 7% above the pool of five runs it was one of, any three of them
pooled within 6% of it; claude-code-high's TTFT p95 18% below to 25% above, three pooled within 9%.

    .venv/bin/python benchmarks/twin_accuracy.py                       # start a server, calibrate, compare
    .venv/bin/python benchmarks/twin_accuracy.py --target http://127.0.0.1:8000 --profile tiny-vllm-cpu
    .venv/bin/python benchmarks/twin_accuracy.py --report results/twin-accuracy/DATE   # re-print a table
    .venv/bin/python benchmarks/twin_accuracy.py --probe --repeat 2      # short calls under decode load
    .venv/bin/python benchmarks/twin_accuracy.py --unseen 6 --shape-seed 7 --repeat 2   # shapes nobody tuned on

`--unseen N` draws N scenarios from the families of `unseen_shapes.py` (Claude Code sessions recorded and
generated, Azure single calls at recorded times and in gamma bursts, Mooncake sessions over shared
prefixes, TraceLab sessions), their settings from `--shape-seed`: a new seed gives shapes no earlier check
saw. Beside each figure the table says in how many real runs it fell inside the band the twin stated for
the same seed (summary.json ``simulation.band``), and under the table: banded figures within their target
bands, real runs inside the twin's band over all banded figures, and the band's half-width on task p50.

`--probe` sends short calls (32 tokens) and long prefills (2,048) every 0.4 s while 0, 16, 48 or 96
streams decode 600 tokens each, and sets their TTFT and the streams' ITL beside the twin's for the
same arrivals: the figures behind "short calls under load are slower than predicted". A call's TTFT
depends on where in a step it arrives, which on the server is chance: the twin's figures pool the
runs of the same arrivals shifted by 0 to 39 ms (`PROBE_SHIFTS`), every phase of a step alike.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from simulator.metrics.histograms import load as load_histograms
from simulator.metrics.histograms import new_histogram
from simulator.metrics.summary import load_summary
from simulator.calibration.on_twin import measure_on_twin
from simulator.calibration.sweep import SweepPoint
from simulator.sim.profile import load_profile
from tiny_vllm import served
from unseen_shapes import write_shapes

ROOT = Path(__file__).resolve().parents[1]
AGENTLOAD = [sys.executable, "-m", "simulator"]
SCENARIOS = sorted((ROOT / "scenarios" / "accuracy").glob("*.yaml"))

FIGURES = (
    # (label, summary path, histogram and percentile pooling the repeats, histogram unit, target band)
    ("output tok/s", ("output_throughput",), None, 1.0, 0.10),
    ("task p50 s", ("tasks", "completion_time_s", "p50"), ("task_completion", 50), 1e-6, 0.10),
    ("task p95 s", ("tasks", "completion_time_s", "p95"), ("task_completion", 95), 1e-6, 0.10),
    ("TTFT p95 ms", ("p95_ttft_ms",), ("ttft", 95), 1e-3, 0.15),
    ("TTFT p50 ms", ("p50_ttft_ms",), ("ttft", 50), 1e-3, None),
    ("TPOT p50 ms", ("p50_tpot_ms",), ("tpot", 50), 1e-3, None),
    ("cached prompt tokens", ("total_cached_tokens",), None, 1.0, None),
    ("client lag p99 ms", ("client_lag_ms", "p99"), ("client_lag", 99), 1e-3, None),
)


def load_average() -> str:
    try:
        return "/".join(f"{v:.2f}" for v in os.getloadavg())
    except OSError:
        return "n/a"


def stolen_seconds() -> float:
    """CPU seconds the hypervisor has taken from this machine since boot (Linux; 0 elsewhere)."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


REFERENCE = SweepPoint("prefill", 1, 1024, 1)
"""A point of the calibration sweep measured again before every real run: how fast the machine is
then, against the calibrated profile's figure for it."""


async def reference_ttft(url: str, repeat: int = 3) -> float:
    """Median TTFT of the reference prefill on the server now (fresh prompts, nothing cached)."""
    from simulator.behaviour import CallRequest
    from simulator.live.client import Client, Target
    from simulator.workload import Call

    call = Call(REFERENCE.input_tokens, REFERENCE.output_tokens)
    ttfts = []
    async with Client(Target(base_url=url, vocab_size=1024), time.perf_counter()) as client:
        for i in range(repeat):
            record, _ = await client.send(CallRequest(f"reference-{time.time_ns()}-{i}", "reference", 0, call),
                                          time.perf_counter() - client.t0)
            if record.ttft is None:
                raise SystemExit(f"reference request failed: {record.error_class}: {record.error_message}")
            ttfts.append(record.ttft)
    return statistics.median(ttfts)


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


def pooled(folders: list[Path], path: tuple[str, ...], histogram: Optional[tuple[str, float]],
           unit: float) -> float:
    """One figure over several runs: a percentile of their merged histograms (all their calls or tasks
    together), or the median of the runs' own values for a figure without one."""
    if histogram is None:
        return statistics.median(figure(load_summary(f), path) for f in folders)
    name, percentile = histogram
    merged = new_histogram()
    for folder in folders:
        merged.add(load_histograms(folder / "histograms.json")[name])
    return merged.get_value_at_percentile(percentile) * unit


def report(out: Path, scenarios: list[str], profile: str) -> list[dict]:
    """Print twin against real for every scenario with runs in `out`; returns the rows."""
    rows = []
    print(f"\nprofile {profile}; load average now {load_average()}")
    print(f"{'scenario':26s} {'figure':20s} {'twin':>10s} {'real (pooled)':>14s} {'real runs':>19s} "
          f"{'twin/real':>9s}  target")
    for name in scenarios:
        real_runs = sorted(out.glob(f"{name}-real-*/summary.json"))
        twin_runs = sorted(out.glob(f"{name}-twin-*/summary.json"))
        if not real_runs or not twin_runs:
            continue
        real_dirs, twin_dirs = [p.parent for p in real_runs], [p.parent for p in twin_runs]
        for label, path, histogram, unit, band in FIGURES:
            per_run = [figure(load_summary(f), path) for f in real_dirs]
            real = pooled(real_dirs, path, histogram, unit)
            twin = pooled(twin_dirs, path, histogram, unit)
            ratio = twin / real if real else float("nan")
            verdict = "" if band is None else ("ok" if abs(ratio - 1) <= band else "MISS") + f" ±{band:.0%}"
            bands = twin_bands(twin_dirs, path)
            inside = band_hits(real_dirs, bands, path)
            pooled_band = None if bands is None else (statistics.mean(b["low"] for b in bands),
                                                      statistics.mean(b["high"] for b in bands))
            pooled_inside = None if pooled_band is None else pooled_band[0] <= real <= pooled_band[1]
            stated = "" if inside is None else (f"  in the twin's band: {sum(inside)} of {len(inside)} runs, "
                                                f"pooled {'yes' if pooled_inside else 'no'}")
            print(f"{name:26s} {label:20s} {twin:10.3f} {real:14.3f} {min(per_run):9.3f}–{max(per_run):9.3f} "
                  f"{ratio:9.3f}  {verdict}{stated}")
            rows.append({"scenario": name, "figure": label, "twin": twin, "real": real, "real_runs": per_run,
                         "ratio": ratio, "band": band, "in_twin_band": inside, "twin_band": bands,
                         "pooled_in_twin_band": pooled_inside})
    summarize_bands(rows)
    return rows


def twin_bands(twin_dirs: list[Path], path: tuple[str, ...]) -> Optional[list[dict]]:
    """Each twin run's band on the figure at `path` (summary.json ``simulation.band``), None without one."""
    key = ".".join(path)
    bands = []
    for folder in twin_dirs:
        band = ((load_summary(folder).to_dict().get("simulation") or {}).get("band") or {}).get("figures", {}).get(key)
        if band is None:
            return None
        bands.append(band)
    return bands


def band_hits(real_dirs: list[Path], bands: Optional[list[dict]], path: tuple[str, ...]) -> Optional[list[bool]]:
    """For each real run, whether its figure lies inside the band the twin stated for the same seed
    (`bands`, one per twin run; None: the twin stated no band on it)."""
    if bands is None or len(bands) != len(real_dirs):
        return None
    return [band["low"] <= figure(load_summary(real), path) <= band["high"] for real, band in zip(real_dirs, bands)]


def summarize_bands(rows: list[dict]) -> None:
    """Print how often the real figure fell in the twin's band, over the banded figures, and the band's
    half-width on task p50 (the mean of its distances below and above the nominal value, relative)."""
    hits = [hit for row in rows if row["band"] is not None and row["in_twin_band"] for hit in row["in_twin_band"]]
    inside = [row for row in rows if row["band"] is not None]
    print(f"\nbanded figures within their target bands (pooled): {sum(abs(r['ratio'] - 1) <= r['band'] for r in inside)} "
          f"of {len(inside)}")
    if hits:
        pooled = [row["pooled_in_twin_band"] for row in rows if row["band"] is not None and row["in_twin_band"]]
        print(f"real runs inside the twin's stated band (banded figures): {sum(hits)} of {len(hits)} "
              f"({sum(hits) / len(hits):.0%}); the runs pooled, inside the mean of their bands: "
              f"{sum(pooled)} of {len(pooled)} ({sum(pooled) / len(pooled):.0%})")
        widths = [max(b["value"] - b["low"], b["high"] - b["value"]) / b["value"]
                  for row in rows if row["figure"] == "task p50 s" and row["twin_band"]
                  for b in row["twin_band"] if b["value"]]
        if widths:
            print(f"twin's band on task p50: widest side {min(widths):.0%} to {max(widths):.0%} of the value "
                  f"(median {statistics.median(widths):.0%})")


def server(args: argparse.Namespace) -> contextlib.AbstractContextManager[str]:
    """The target URL: the one given, or a tiny-model vLLM server started for the benchmark."""
    return served(args.target, Path(args.model_dir))


PROBE_STREAMS = (0, 16, 48, 96)
"""Streams decoding while the probes are sent (`--probe`)."""
PROBE_CALLS = ((32, 2), (32, 2), (2048, 2), (32, 2), (32, 2), (2048, 2), (32, 2), (32, 2))
"""The probes: short calls and long prefills, one every `PROBE_SPACING` seconds."""
PROBE_SPACING = 0.4
PROBE_STREAM = (64, 600)
"""Prompt and output tokens of each stream."""
PROBE_SHIFTS = [k * 0.001 for k in range(40)]
"""Shifts of the probes' times on the twin (seconds), pooled: at least two steps of every phase."""


def probe_twin(profile, streams: int, shift: float = 0.0) -> dict:
    """The probe experiment on the twin: the same streams and probes at the same times (`shift` later)."""
    import simpy

    from simulator.sim.make_twin import make_twin

    env = simpy.Environment()
    twin = make_twin(env, profile, fast_decode=False)
    out: dict = {"probes": [], "itl": []}
    start = (1.5 if streams else 0.2) + shift

    def stream():
        out["itl"].append((yield twin.submit(*PROBE_STREAM)).itl_mean)

    def probe(j, p, o):
        yield env.timeout(start + PROBE_SPACING * j)
        out["probes"].append((j, p, (yield twin.submit(p, o)).ttft))

    for _ in range(streams):
        env.process(stream())
    for j, (p, o) in enumerate(PROBE_CALLS):
        env.process(probe(j, p, o))
    env.run()
    return out


async def probe_real(url: str, streams: int, tag: str) -> dict:
    """The probe experiment on the server: `streams` long decodes, then the probes while they run."""
    from simulator.behaviour import CallRequest
    from simulator.live.client import Client, Target
    from simulator.workload import Call

    out: dict = {"probes": [], "itl": []}
    async with Client(Target(base_url=url, vocab_size=1024), time.perf_counter()) as client:
        t0, start = client.t0, (1.5 if streams else 0.2)

        async def stream(i):
            record, _ = await client.send(CallRequest(f"{tag}-s{i}", "stream", 0, Call(*PROBE_STREAM)),
                                          time.perf_counter() - t0)
            out["itl"].append(record.itl_mean)

        async def probe(j, p, o):
            await asyncio.sleep(max(0.0, start + PROBE_SPACING * j - (time.perf_counter() - t0)))
            record, _ = await client.send(CallRequest(f"{tag}-p{j}", "probe", 0, Call(p, o)),
                                          time.perf_counter() - t0)
            out["probes"].append((j, p, record.ttft))

        await asyncio.gather(*(stream(i) for i in range(streams)),
                             *(probe(j, p, o) for j, (p, o) in enumerate(PROBE_CALLS)))
    return out


def probe_figures(run: dict) -> tuple[float, float, float]:
    """Median TTFT of the short probes and of the long ones (ms), median stream ITL (ms)."""
    short = [t for _, p, t in run["probes"] if p < 100 and t is not None]
    long = [t for _, p, t in run["probes"] if p >= 100 and t is not None]
    itl = [v for v in run["itl"] if v]
    return (statistics.median(short) * 1e3, statistics.median(long) * 1e3,
            statistics.median(itl) * 1e3 if itl else float("nan"))


def probe(url: str, profile_name: str, repeat: int) -> None:
    """Short calls and long prefills sent while 0 to 96 streams decode, on the server and on the twin:
    where the twin misses what load does to a short call's first token."""
    profile = load_profile(profile_name)
    real: dict[int, list] = {}
    for r in range(repeat):
        for streams in PROBE_STREAMS:
            run = asyncio.run(probe_real(url, streams, f"probe-{time.time_ns()}-{r}"))
            real.setdefault(streams, []).append(probe_figures(run))
    print(f"profile {profile_name}; {repeat} runs each, medians; load average now {load_average()}")
    print(f"{'streams':>7s} {'short TTFT ms real':>19s} {'twin':>7s} {'2048-token TTFT ms real':>24s} {'twin':>7s} "
          f"{'stream ITL ms real':>19s} {'twin':>7s}")
    for streams in PROBE_STREAMS:
        measured = [statistics.median(values) for values in zip(*real[streams])]
        runs = [probe_twin(profile, streams, shift) for shift in PROBE_SHIFTS]
        predicted = probe_figures({key: [v for run in runs for v in run[key]] for key in ("probes", "itl")})
        print(f"{streams:7d} {measured[0]:19.1f} {predicted[0]:7.1f} {measured[1]:24.1f} {predicted[1]:7.1f} "
              f"{measured[2]:19.2f} {predicted[2]:7.2f}")


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
    parser.add_argument("--unseen", type=int, metavar="N",
                        help="instead of --scenario: N shapes drawn by benchmarks/unseen_shapes.py from --shape-seed")
    parser.add_argument("--shape-seed", type=int, help="seed of the drawn shapes (--unseen; default: from the clock)")
    parser.add_argument("--repeat", type=int, default=5, help="real runs per scenario")
    parser.add_argument("--seed", type=int, help="seed of the first run (default: from the clock)")
    parser.add_argument("--output", default=str(ROOT / "results" / "twin-accuracy"), help="result folder")
    parser.add_argument("--report", metavar="DIR", help="only print the table of a finished benchmark folder")
    parser.add_argument("--probe", action="store_true",
                        help="instead: short calls and long prefills sent while 0 to 96 streams decode, on the "
                        "server and on the twin of --profile (default tiny-vllm-cpu), --repeat runs each")
    args = parser.parse_args()
    if args.probe:
        with server(args) as url:
            probe(url, args.profile or "tiny-vllm-cpu", args.repeat)
        return 0
    if args.report:
        folder = Path(args.report)
        calibrated = folder / "tiny-vllm-cpu-calibrated.yaml"
        report(folder, sorted({p.name.rsplit("-real-", 1)[0] for p in folder.glob("*-real-*") if p.is_dir()}),
               str(calibrated) if calibrated.exists() else "(given)")
        return 0

    out = Path(args.output) / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    seed = args.seed if args.seed is not None else int(time.time()) % 1_000_000
    if args.unseen:
        shape_seed = args.shape_seed if args.shape_seed is not None else seed
        scenarios = write_shapes(out / "shapes", shape_seed, args.unseen)
        print(f"{args.unseen} shapes drawn with --shape-seed {shape_seed} into {out / 'shapes'}")
    else:
        scenarios = [Path(s) for s in args.scenario] if args.scenario else SCENARIOS
    print(f"results in {out}; first seed {seed}; load average {load_average()}", flush=True)

    with server(args) as url:
        profile = args.profile
        if profile is None:
            profile = str(out / "tiny-vllm-cpu-calibrated.yaml")
            agentload(["calibrate", "-p", args.base_profile, "--target", url, "--vocab-size", "1024",
                       "--repeat", str(args.calibrate_repeat), "--statistic", args.statistic,
                       "-o", profile, "--name", "tiny-vllm-cpu"], out / "calibrate.log")
            print((out / "calibrate.log").read_text(), flush=True)
        reference = measure_on_twin(REFERENCE, load_profile(profile))
        # Repeats go round the scenarios, so a drift of the machine's speed over the benchmark
        # reaches every scenario alike instead of whichever runs last.
        for r in range(args.repeat):
            for index, scenario in enumerate(scenarios):
                run_seed = seed + 1000 * index + r
                sets = ["--set", f"target.base_url={url}", "--set", f"run.seed={run_seed}"]
                real_dir, sim_dir = out / f"{scenario.stem}-real-{r}", out / f"{scenario.stem}-twin-{r}"
                speed = asyncio.run(reference_ttft(url)) / reference
                before, stolen = load_average(), stolen_seconds()
                agentload(["run", str(scenario), "-o", str(real_dir), "--no-progress", *sets],
                          out / f"{scenario.stem}-real-{r}.log")
                print(f"  reference prefill took {speed:.2f}x the calibrated time; load average before "
                      f"{before}, after {load_average()}; {stolen_seconds() - stolen:.1f} CPU s stolen by the "
                      "hypervisor", flush=True)
                agentload(["simulate", str(scenario), "-p", profile, "-o", str(sim_dir), *sets],
                          out / f"{scenario.stem}-twin-{r}.log")

    rows = report(out, [s.stem for s in scenarios], profile)
    (out / "accuracy.json").write_text(json.dumps({"profile": profile, "rows": rows}, indent=2))
    print(f"\nwrote {out / 'accuracy.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
