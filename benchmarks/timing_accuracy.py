"""How accurately a live run measures: the emulator answers with a fixed TTFT and ITL, many streams
run at once, and the measured TTFT/ITL are compared with the true ones, with the client's own lag.

    .venv/bin/python benchmarks/timing_accuracy.py [--streams 256] [--ttft 0.1] [--itl 0.02]

Targets: measured minus true within 2 ms at p50 and 5 ms at p99; client lag p99 within 5 ms. The
emulator runs in its own process (so its work does not delay the client's loop); `--same-process`
puts both on one event loop for comparison; `--pin` puts the emulator on the first core and the client on
the last. On a busy machine the figures include the noise.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simulator.live.client import Client, Target  # noqa: E402
from simulator.live.driver import Driver  # noqa: E402
from simulator.workload import Call, Task, Workload  # noqa: E402

EMULATOR = """
import asyncio, sys
from simulator.emulator.server import run_emulator
async def main():
    async with run_emulator(ttft={ttft}, itl={itl}, max_num_seqs=100000) as url:
        print(url, flush=True)
        await asyncio.Event().wait()
asyncio.run(main())  # asyncio's loop, as serve-emulator: requests timed from their kernel arrival stamp
"""


class Gaps:
    """Collects every record and inter-token gap."""

    def __init__(self) -> None:
        self.calls, self.gaps = [], []
        self.busy = 0.0
        self.waiting = 0.0
        self.emulator: dict = {}

    def call(self, record, gaps=()) -> None:
        self.calls.append(record)
        self.gaps.extend(gaps)

    def task(self, record) -> None:
        pass


def workload(streams: int, calls: int, tokens: int, spread: float) -> Workload:
    return Workload(tuple(
        Task(f"s{i}", tuple(Call(input_tokens=256, output_tokens=tokens, gap=0.005) for _ in range(calls)),
             arrival=spread * i / streams)
        for i in range(streams)))


def run_queue_seconds() -> float:
    """Seconds this process's main thread has been runnable but waiting for a CPU (/proc schedstat)."""
    try:
        with open("/proc/self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except OSError:
        return float("nan")


async def emulator_stats(url: str) -> dict:
    """The emulator's own counters and lateness (its GET /agentload/stats); {} when it has none."""
    import aiohttp

    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(url + "/agentload/stats") as resp:
                return await resp.json() if resp.status == 200 else {}
    except aiohttp.ClientError:
        return {}


async def measure(url: str, args: argparse.Namespace) -> Gaps:
    sink = Gaps()
    wall, cpu, queued = time.perf_counter(), time.process_time(), run_queue_seconds()
    async with Client(Target(base_url=url), time.perf_counter()) as client:
        t0 = client.t0 = time.perf_counter()
        driver = Driver(client, workload(args.streams, args.calls, args.tokens, args.spread), sink, t0=t0)
        await driver.run()
        sink.emulator = await emulator_stats(url)
    sink.busy = (time.process_time() - cpu) / (time.perf_counter() - wall)
    sink.waiting = (run_queue_seconds() - queued) / (time.perf_counter() - wall)
    return sink


async def same_process(args: argparse.Namespace) -> Gaps:
    from simulator.emulator.server import run_emulator

    async with run_emulator(ttft=args.ttft, itl=args.itl, max_num_seqs=100000) as url:
        return await measure(url, args)


def report(sink: Gaps, args: argparse.Namespace) -> None:
    ok = [c for c in sink.calls if c.ok]
    ttft_err = (np.array([c.ttft for c in ok]) - args.ttft) * 1000
    itl_err = (np.array(sink.gaps) - args.itl) * 1000
    lag = np.array([c.client_lag for c in sink.calls]) * 1000
    print(f"{args.streams} streams x {args.calls} calls x {args.tokens} tokens; true TTFT {args.ttft * 1000:g} ms, "
          f"ITL {args.itl * 1000:g} ms; {len(ok)}/{len(sink.calls)} calls ok, {len(sink.gaps)} gaps")
    print(f"  client process CPU: {100 * sink.busy:.0f}% of one core over the run (near 100%: the client is the limit)")
    print(f"  client waiting for a CPU: {100 * sink.waiting:.0f}% of the run (large: other processes are the limit)")
    late = sink.emulator.get("emit_lateness")
    if late:
        print(f"  emulator wrote tokens late by p50 {late['p50'] * 1000:.2f} ms, p99 {late['p99'] * 1000:.2f} ms "
              "(its own error, inside the errors below)")
    if "connections_opened" in sink.emulator:
        print(f"  connections the emulator accepted: {sink.emulator['connections_opened']} "
              f"for {sink.emulator['requests']} calls")
    for name, err in (("TTFT error", ttft_err), ("ITL error", itl_err), ("client lag", lag)):
        p50, p99 = np.percentile(err, [50, 99])
        print(f"  {name:11s} p50 {p50:+7.2f} ms   p99 {p99:+7.2f} ms   (target |p50| <= 2, |p99| <= 5)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=256)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=50)
    parser.add_argument("--ttft", type=float, default=0.1)
    parser.add_argument("--itl", type=float, default=0.02)
    parser.add_argument("--spread", type=float, default=0.5, help="seconds over which streams arrive")
    parser.add_argument("--same-process", action="store_true")
    parser.add_argument("--pin", action="store_true", help="emulator on the first core, client on the last")
    args = parser.parse_args()
    with asyncio.Runner() as runner:  # agentload run's loop
        if args.same_process:
            sink = runner.run(same_process(args))
        else:
            code = EMULATOR.format(ttft=args.ttft, itl=args.itl)
            proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                                    cwd=Path(__file__).resolve().parents[1])
            try:
                if args.pin:
                    cores = sorted(os.sched_getaffinity(0))
                    os.sched_setaffinity(proc.pid, {cores[0]})
                    os.sched_setaffinity(0, {cores[-1]})
                url = proc.stdout.readline().strip()
                sink = runner.run(measure(url, args))
            finally:
                proc.terminate()
                proc.wait(timeout=10)
    report(sink, args)


if __name__ == "__main__":
    main()
