"""Capacity and timing error of one client process and of 1 and 2 shards on Ray, and the scaling
efficiency: how much of a second shard's CPU turns into measured load.

    .venv/bin/python benchmarks/ray_scaling.py [--levels 256,1024] [--duration 6] [--zero]

For each level, every stream is one long agent task: calls back to back with a short tool gap
(``--think``), streams starting over ``--ramp`` seconds (left out of the figures as the run's warm-up),
then ``--duration`` seconds measured; the run's drain deadline then cancels what is in flight. The
server is the emulator in a child process: fixed timing (``--ttft``, ``--itl``: TTFT and ITL error
against that truth) or, with ``--zero``, no delay at all (tokens as fast as it writes them: the most
load a client sees, without a timing truth). Modes: ``1 process`` (`agentload run`), ``ray, N
shard(s)`` (`agentload run --ray` with run.workers N). Printed per mode:

- output tokens/s of the calls that ended in the measured window, and calls/s;
- client CPU per output token (microseconds: the shards' processes, or this process, over the whole
  replay, per token of the whole replay) and the shards' share of a core: robust on a shared machine,
  where wall-clock figures include waiting for a CPU;
- client lag, TTFT error and ITL error at p50 and p99 (from the run's summary: its histograms);
- for 2 shards, two scaling efficiencies: in tokens/s (tokens/s with 2 shards / (2 x tokens/s with 1
  shard)), which needs a core per shard and a server that is not the limit, and per core (client CPU
  per token with 1 shard / with 2 shards): the share of one shard's rate each of two shards keeps when
  each has a core of its own, which holds on a machine where the first does not.

All processes (emulator, shards, Ray's own) share this machine's cores: with 2 cores the emulator
takes one, so two shards cannot both get a whole core, and the tokens/s efficiency says how far that
is from 1. The load average is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simulator import scenario as scenario_mod  # noqa: E402
from simulator.emulator.process import emulator_process  # noqa: E402
from simulator.pipeline.live import run_scenario  # noqa: E402
from simulator.metrics import results  # noqa: E402
from simulator.workload import Call, Task, Workload  # noqa: E402


def workload(streams: int, args: argparse.Namespace) -> Workload:
    per_call = args.think + (0.0 if args.zero else args.ttft + args.itl * (args.tokens - 1))
    calls = int((args.ramp + args.duration) / max(per_call, 0.005)) + 2  # more than fit: the drain ends them
    return Workload(tuple(
        Task(f"s{i}", (Call(256, args.tokens, gap=args.think),) * calls, arrival=0.5 + args.ramp * i / streams)
        for i in range(streams)))


def scenario(url: str, args: argparse.Namespace) -> Any:
    text = (f"name: scaling\nworkload: {{synthetic: {{input_tokens: 1, output_tokens: 1, concurrency: 1}}}}\n"
            f"target: {{base_url: '{url}', metrics: false, stall_timeout: 30}}\n"
            f"run: {{warmup: {0.5 + args.ramp}, drain: {args.duration}}}\n")
    return scenario_mod.parse(text, "scaling.yaml")


async def one(mode: str, shards: int, streams: int, args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    cli = ["--ttft", "0", "--itl", "0"] if args.zero else ["--ttft", str(args.ttft), "--itl", str(args.itl)]
    async with emulator_process(*cli, "--max-num-seqs", "100000") as emulator:
        sc, wl = scenario(emulator.url, args), workload(streams, args)
        cpu0 = time.process_time()
        if mode == "process":
            summary, _ = await run_scenario(sc, wl, folder, handle_sigint=False, preflight=False)
            cpu, cores = time.process_time() - cpu0, None
        else:
            from simulator.pipeline.sharded import run_sharded

            summary, _ = await run_sharded(sc, wl, folder, workers=shards, handle_sigint=False, preflight=False)
            figures = summary.to_dict()["shards"]
            cpu = sum(s["cpu_s"] for s in figures)
            cores = [s["cpu_share"] for s in figures]
    start, end = 0.5 + args.ramp, 0.5 + args.ramp + args.duration
    tokens = calls = all_tokens = 0
    for c in results.iter_calls(folder):
        all_tokens += c.output_tokens if c.ok else 0
        if c.ok and start <= c.end <= end:
            tokens += c.output_tokens
            calls += 1
    s = summary.to_dict()
    # CPU over the whole replay (set-up, warm pool and drain included) per token of the whole replay
    return {"tokens_s": tokens / args.duration, "calls_s": calls / args.duration,
            "us_per_token": 1e6 * cpu / max(all_tokens, 1), "cores": cores,
            "lag": (s["client_lag_ms"]["p50"], s["client_lag_ms"]["p99"]),
            "ttft": (s["p50_ttft_ms"] - 1000 * args.ttft, s["p99_ttft_ms"] - 1000 * args.ttft),
            "itl": (s["p50_itl_ms"] - 1000 * args.itl, s["p99_itl_ms"] - 1000 * args.itl)}


def line(label: str, f: dict[str, Any], zero: bool) -> str:
    cores = "" if f["cores"] is None else " cores " + "+".join(f"{c:.2f}" for c in f["cores"])
    text = (f"  {label:16s} {f['tokens_s']:10.0f} tok/s {f['calls_s']:8.0f} calls/s {f['us_per_token']:6.1f} us/tok"
            f"   lag p50 {f['lag'][0]:6.2f} p99 {f['lag'][1]:7.2f} ms")
    if not zero:
        text += (f"   TTFT err p50 {f['ttft'][0]:+6.2f} p99 {f['ttft'][1]:+7.2f}"
                 f"   ITL err p50 {f['itl'][0]:+6.2f} p99 {f['itl'][1]:+6.2f} ms")
    return text + cores


async def main(args: argparse.Namespace) -> None:
    import ray

    ray.init(num_cpus=max(2, max(args.shards)), include_dashboard=False, log_to_driver=False,
             logging_level=logging.ERROR)
    truth = "no delay (--zero)" if args.zero else f"TTFT {args.ttft * 1000:g} ms, ITL {args.itl * 1000:g} ms"
    print(f"emulator: {truth}; {args.tokens} output tokens a call, think {args.think * 1000:g} ms; "
          f"{args.ramp:g} s ramp, {args.duration:g} s measured; {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        for streams in args.levels:
            print(f"{streams} streams:", flush=True)
            figures = {}
            for mode, shards in [("process", 0)] + [("ray", n) for n in args.shards]:
                label = "1 process" if mode == "process" else f"ray, {shards} shard(s)"
                figures[shards] = await one(mode, shards, streams, args, Path(tmp) / f"{streams}-{mode}{shards}")
                print(line(label, figures[shards], args.zero), flush=True)
            if 1 in figures and 2 in figures and figures[1]["tokens_s"]:
                print(f"  scaling efficiency, 2 shards over 1: {figures[2]['tokens_s'] / (2 * figures[1]['tokens_s']):.2f}"
                      f" in tokens/s, {figures[1]['us_per_token'] / figures[2]['us_per_token']:.2f} per core "
                      f"(client CPU per token {figures[2]['us_per_token']:.1f} vs {figures[1]['us_per_token']:.1f} us)",
                      flush=True)
    ray.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default=[256, 1024], type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--shards", default=[1, 2], type=lambda s: [int(x) for x in s.split(",")])
    parser.add_argument("--duration", type=float, default=6.0)
    parser.add_argument("--ramp", type=float, default=1.0)
    parser.add_argument("--tokens", type=int, default=50)
    parser.add_argument("--think", type=float, default=0.005)
    parser.add_argument("--ttft", type=float, default=0.05)
    parser.add_argument("--itl", type=float, default=0.01)
    parser.add_argument("--zero", action="store_true", help="an emulator without delay (no timing truth)")
    args = parser.parse_args()
    if args.zero:
        args.ttft = args.itl = 0.0
    asyncio.run(main(args))  # agentload run's loop (kernel receive stamps reach the client through it)
