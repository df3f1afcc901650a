"""What the recorder (`agentload record`) costs the traffic passing through it: added time to first token,
and the CPU it needs per call and per streamed token (not run as a test; prints its figures).

One emulator (`agentload serve-emulator`) and one recorder in front of it (`agentload record`) run as child
processes; the client runs here, in one event loop (aiohttp). Every stream is a closed loop of streaming
completions whose prompt is token ids, as an agent's: a task's first prompt is ``--prompt`` tokens (the first
``--shared`` of them the same for every stream, as a system prompt), each next call's prompt is the last
one plus ``--grow`` fresh tokens, and after ``--task-calls`` calls the stream starts a new task. Every call
asks for ``--output-tokens`` tokens (the emulator always writes exactly that many), so the recorder's
hashing, task grouping and stream reading do the work they do for real agents. The same streams are sent
direct to the emulator and through the recorder, in passes whose order turns (direct, recorder, recorder,
direct, ...: a drift of the machine falls on both sides alike). With ``--bare`` a third side goes through a
bare aiohttp pass-through proxy of this script (the recorder's make, recording nothing): what the hop
itself costs, so that the recorder's own part shows.

1. Added latency. The emulator has fixed timing (``--ttft``/``--itl``, 50/10 ms: the server is neither the
   bottleneck nor a source of spread). TTFT is measured at the client, from just before the request is
   sent to the arrival of the first chunk holding a choice; its p50 and p99 over the calls sent in the
   passes' measured windows (after a ramp in which streams start), direct and through the proxy, and
   "added" = the proxy side's percentile minus direct's (a difference of percentiles, not a percentile of
   differences), with a 95% bootstrap interval (each side resampled on its own, seeded). Twice: with
   streams that do not ask for usage (the recorder adds ``stream_options.include_usage`` and takes the
   usage event out again: the client checks it never sees one) and with streams that ask for it. Beside
   them the CPU of the proxy, the client and the emulator (share of one core, user+system) and the share of
   the time the proxy was runnable but had no CPU. When some process waited for a CPU 10% of the time or
   more, a note says the machine was short of CPU: the row then measures the machine more than the proxy
   (256 streams at 10 ms a token is 25,600 chunks/s, which the client, the emulator and a proxy in Python
   each must read or write: more than two cores give).
2. Capacity per core. The emulator with no delay at all (``--ttft 0 --itl 0``) and ``--capacity-streams``
   streams that keep it saturated; the client (this process) and the emulator pinned to the first core, the
   proxy alone on the last (``sched_setaffinity``, as ``taskset`` does). Calls/s and output tokens/s that
   complete direct and through the proxy, and the proxy's own CPU seconds (``/proc/PID/stat``, user and
   system) per call and per streamed token, from which the calls/s one core of it carries (calls / its
   CPU-seconds). "Capacity through the recorder as % of direct, per core" is calls/s completed through the
   recorder over calls/s completed direct, the same client and emulator on one core in both: at 100% the
   recorder, on its one core, kept up with all that core sent.

Targets (issue 35): added TTFT p50 <= 0.5 ms and p99 <= 2 ms at 64 and 256 streams; capacity through the
recorder >= 90% of direct. The machine's cores and load average are printed with the figures: on a shared
machine others' load lands in them (more at p99 than at p50). ``--proxy-loop uvloop`` runs the recorder (and
the bare proxy) on uvloop's event loop instead of asyncio's; ``--profile`` runs the recorder under cProfile
(slower: its figures are then not the recorder's) and prints where its time goes.

    python benchmarks/recorder_overhead.py                                   # the whole run, ~2 minutes
    python benchmarks/recorder_overhead.py --streams 64 --seconds 2 --repeats 1 --skip-capacity
    python benchmarks/recorder_overhead.py --bare --streams 256 --itl 0.04   # the hop alone; fewer chunks/s
    python benchmarks/recorder_overhead.py --skip-latency --profile /tmp/rec.prof --seconds 2 --repeats 1
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pstats
import signal
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

import aiohttp
from aiohttp import web
import numpy as np
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from recorder_runs import python_child  # noqa: E402 - the tests' way to run a server in a child process
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
CORES = sorted(os.sched_getaffinity(0))
TARGET_P50_MS, TARGET_P99_MS, TARGET_CAPACITY = 0.5, 2.0, 0.90
"""Issue 35's targets: added TTFT p50 and p99 (ms), capacity through the recorder over direct."""
BOOTSTRAP = 1000
VOCAB = 32000
"""The emulator's default vocabulary: prompt token ids stay below it."""


# ---- child processes ----------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> np.ndarray:
    """CPU seconds process `pid` has used, in user and in system (kernel) mode, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return np.array([int(fields[11]), int(fields[12])]) / CLOCK_TICKS


def wait_seconds(pid: int) -> float:
    """Seconds process `pid`'s main thread was runnable but not running (/proc schedstat)."""
    try:
        with open(f"/proc/{pid}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except OSError:
        return float("nan")


# ---- the client -----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Shape:
    """The streams' calls (see the module docstring)."""

    prompt: int
    shared: int
    grow: int
    task_calls: int
    output_tokens: int
    think: float
    asks_usage: bool
    seed: int


@dataclass
class Pass:
    """What one pass of closed-loop streams measured."""

    ttft: list[float] = field(default_factory=list)
    """Seconds, of the calls sent in the window."""
    sent: int = 0
    ended: int = 0
    """Calls that ended (whole) in the window."""
    failed: int = 0
    usage_wrong: int = 0
    """Calls whose stream had a usage event it did not ask for, or lacked one it asked for."""
    cpu: dict[str, np.ndarray] = field(default_factory=dict)
    """CPU seconds (user, system) over the window, per process: ``client``, ``emulator`` and the proxies."""
    waited: dict[str, float] = field(default_factory=dict)
    """Seconds runnable but not running over the window, per process (the client's main thread included)."""
    wall: float = 0.0


async def one_stream(session: aiohttp.ClientSession, url: str, n: int, shape: Shape, begin: float, start: float,
                     stop: float, out: Pass) -> None:
    """Stream `n`: calls back to back (``think`` apart) from `begin` until `stop`; figures kept for calls sent
    in [start, stop)."""
    rng = np.random.default_rng([shape.seed, n])
    shared = np.random.default_rng(shape.seed).integers(0, VOCAB, shape.shared)
    body = {"model": "agentload-emulator", "max_tokens": shape.output_tokens, "stream": True}
    if shape.asks_usage:
        body["stream_options"] = {"include_usage": True}
    await asyncio.sleep(max(0.0, begin - time.perf_counter()))
    calls = 0
    prompt = shared
    while time.perf_counter() < stop:
        if calls % shape.task_calls == 0:
            prompt = np.concatenate([shared, rng.integers(0, VOCAB, shape.prompt - shape.shared)])
        else:
            prompt = np.concatenate([prompt, rng.integers(0, VOCAB, shape.grow)])
        calls += 1
        data = orjson.dumps({**body, "prompt": prompt}, option=orjson.OPT_SERIALIZE_NUMPY)
        t0 = time.perf_counter()
        first = None
        usage = False
        try:
            async with session.post(url, data=data, headers={"content-type": "application/json"}) as resp:
                ok = resp.status == 200
                async for chunk in resp.content.iter_any():
                    if first is None and b'"choices":[{' in chunk:
                        first = time.perf_counter()
                    if b'"usage"' in chunk:
                        usage = True
        except (aiohttp.ClientError, asyncio.TimeoutError):
            ok = False
        end = time.perf_counter()
        if start <= end < stop and ok:
            out.ended += 1
        if start <= t0 < stop:
            out.sent += 1
            if not ok or first is None:
                out.failed += 1
            else:
                out.ttft.append(first - t0)
                out.usage_wrong += usage != shape.asks_usage
        if shape.think:
            await asyncio.sleep(shape.think)


async def closed_loop(url: str, streams: int, shape: Shape, ramp: float, seconds: float,
                      pids: dict[str, int]) -> Pass:
    """`streams` closed-loop streams against `url` (``/v1/completions``): they start over `ramp` seconds, then
    `seconds` are measured (CPU of this process and of `pids` included); calls in flight at the end finish."""
    out = Pass()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=120)) as session:
        now = time.perf_counter()
        start = now + ramp
        stop = start + seconds
        tasks = [asyncio.ensure_future(one_stream(session, url + "/v1/completions", n, shape,
                                                  now + ramp * n / streams, start, stop, out))
                 for n in range(streams)]
        await asyncio.sleep(max(0.0, start - time.perf_counter()))
        cpu0 = {name: cpu_seconds(pid) for name, pid in pids.items()}
        waiting = {**pids, "client": os.getpid()}
        wait0 = {name: wait_seconds(pid) for name, pid in waiting.items()}
        mine0, wall0 = os.times(), time.perf_counter()
        await asyncio.sleep(max(0.0, stop - time.perf_counter()))
        out.cpu = {name: cpu_seconds(pid) - cpu0[name] for name, pid in pids.items()}
        out.waited = {name: wait_seconds(pid) - wait0[name] for name, pid in waiting.items()}
        mine = os.times()
        out.cpu["client"] = np.array([mine.user - mine0.user, mine.system - mine0.system])
        out.wall = time.perf_counter() - wall0
        await asyncio.gather(*tasks)
    return out


# ---- the bare proxy -------------------------------------------------------------------------------------------

HOP = frozenset(("connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                 "transfer-encoding", "upgrade", "host", "content-length"))
"""Headers of one hop, not passed on (as the recorder drops them)."""


async def serve_bare(upstream: str) -> None:
    """A pass-through proxy and nothing else (aiohttp, as the recorder: the body read whole and sent on, the
    answer streamed back chunk by chunk as read); what any proxy of this make costs, recording aside."""
    session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None), auto_decompress=False,
                                    connector=aiohttp.TCPConnector(limit=0))

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        async with session.request(request.method, upstream + request.path_qs, headers=headers, data=body,
                                   allow_redirects=False) as up:
            response = web.StreamResponse(status=up.status, headers={k: v for k, v in up.headers.items()
                                                                     if k.lower() not in HOP})
            await response.prepare(request)
            async for chunk in up.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    app = web.Application(client_max_size=1 << 30)
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    print(f"bare proxy listening on http://127.0.0.1:{runner.addresses[0][1]}", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await runner.cleanup()
    await session.close()


# ---- figures --------------------------------------------------------------------------------------------------

SIDE_NAMES = {"direct": "direct", "recorder": "recorder", "bare": "bare proxy"}


@dataclass
class Side:
    """The passes of one side (direct, recorder, bare proxy) of one measurement, pooled."""

    passes: list[Pass]

    @property
    def ttft(self) -> np.ndarray:
        return np.array([x for p in self.passes for x in p.ttft])

    @property
    def wall(self) -> float:
        return sum(p.wall for p in self.passes)

    @property
    def ended(self) -> int:
        return sum(p.ended for p in self.passes)

    @property
    def failed(self) -> int:
        return sum(p.failed for p in self.passes)

    @property
    def usage_wrong(self) -> int:
        return sum(p.usage_wrong for p in self.passes)

    def cpu(self, name: str) -> np.ndarray:
        """CPU seconds (user, system) of process `name` over the windows."""
        return sum((p.cpu[name] for p in self.passes), np.zeros(2))

    def waited(self, name: str) -> float:
        return sum(p.waited[name] for p in self.passes)


def added(direct: np.ndarray, through: np.ndarray, q: float, seed: int) -> tuple[float, float, float]:
    """Percentile `q` through a proxy minus direct's, in ms, and its 95% bootstrap interval."""
    point = np.percentile(through, q) - np.percentile(direct, q)
    rng = np.random.default_rng(seed)
    a = np.percentile(rng.choice(direct, (BOOTSTRAP, direct.size)), q, axis=1)
    b = np.percentile(rng.choice(through, (BOOTSTRAP, through.size)), q, axis=1)
    lo, hi = np.percentile(b - a, [2.5, 97.5])
    return point * 1e3, lo * 1e3, hi * 1e3


def order(sides: list[str], repeats: int) -> list[str]:
    """The passes' sides: in turn forward and backward (direct, recorder, recorder, direct, ...), so that a
    linear drift of the machine falls on every side alike."""
    out: list[str] = []
    for i in range(repeats):
        out += sides if i % 2 == 0 else sides[::-1]
    return out


def shape_of(args: argparse.Namespace, asks_usage: bool) -> Shape:
    return Shape(args.prompt, args.shared, args.grow, args.task_calls, args.output_tokens, args.think, asks_usage,
                 args.seed)


def ms(x: float) -> str:
    return f"{x * 1e3:.2f}"


def share(cpu: np.ndarray, wall: float) -> str:
    """CPU (user, system) over `wall` as a share of one core: ``total% (user+system)``."""
    return f"{100 * cpu.sum() / wall:.0f}% ({100 * cpu[0] / wall:.0f}+{100 * cpu[1] / wall:.0f})"


SHORT_OF_CPU = 0.10
"""A process that waited for a CPU this share of the time or more: the machine was short of CPU."""


def short_of_cpu(result: dict[str, Side], only: Optional[set[str]] = None) -> str:
    """A note when some process of these passes (of `only`, when given) waited for a CPU `SHORT_OF_CPU` of
    the time or more."""
    worst = max(((got.waited(name) / got.wall, f"{name} ({SIDE_NAMES[side]} passes)")
                 for side, got in result.items() for name in got.passes[0].waited if only is None or name in only),
                default=(0.0, ""))
    if worst[0] < SHORT_OF_CPU:
        return ""
    return (f"         note: the machine was short of CPU (the {worst[1]} waited for one {100 * worst[0]:.0f}% of the "
            f"time): these figures are the machine's more than the proxy's")


async def measure(sides: list[str], urls: dict[str, str], pids: dict[str, int], streams: int, shape: Shape,
                  ramp: float, args: argparse.Namespace) -> dict[str, Side]:
    runs: dict[str, list[Pass]] = {side: [] for side in sides}
    for side in order(sides, args.repeats):
        runs[side].append(await closed_loop(urls[side], streams, shape, ramp, args.seconds, pids))
    return {side: Side(passes) for side, passes in runs.items()}


async def latency(args: argparse.Namespace, urls: dict[str, str], pids: dict[str, int]) -> list[bool]:
    """Part 1; prints its table and returns, per recorder row, whether both targets were met."""
    sides = list(urls)
    print(f"\n1. Added TTFT: emulator with fixed ttft {args.ttft * 1e3:.0f} ms, itl {args.itl * 1e3:.0f} ms; "
          f"{args.output_tokens} output tokens a call; prompts of {args.prompt:,} tokens ({args.shared:,} shared by "
          f"all streams) growing by {args.grow:,} a call, a new task every {args.task_calls} calls; "
          f"{'calls back to back' if not args.think else f'{args.think:g} s between a call and the next'}; "
          f"{args.repeats} pass(es) of {args.seconds:g} s per side after a {args.ramp:g} s ramp, sides in the "
          f"order {', '.join(SIDE_NAMES[s] for s in order(sides, args.repeats))}.")
    print("   TTFT at the client (ms, pooled over the passes); added = this side's percentile minus direct's "
          "[95% bootstrap interval]; cpu = share of one core over the side's windows (user+system); wait = share "
          "of them the proxy was runnable but had no CPU; us/call = proxy CPU per call that ended in them.")
    print(f"{'streams':>7}  {'client asks usage':<18} {'side':<10} {'calls':>6} {'ttft p50':>8} {'p99':>7}  "
          f"{'added p50 [95%]':>24}  {'added p99 [95%]':>24}  {'proxy cpu':>12} {'wait':>5} {'us/call':>7}  "
          f"{'client cpu':>12} {'emulator cpu':>12}")
    met = []
    for streams in args.streams:
        for asks in (False, True):
            result = await measure(sides, urls, pids, streams, shape_of(args, asks), args.ramp, args)
            direct = result["direct"].ttft
            usage = "yes" if asks else "no (proxy adds)"
            if min(got.ttft.size for got in result.values()) == 0:
                raise SystemExit(f"no call got a first token on some side at {streams} streams "
                                 f"(failed: {', '.join(f'{s} {g.failed:,}' for s, g in result.items())})")
            for side, got in result.items():
                ttft = got.ttft
                row = (f"{streams:>7}  {usage:<18} {SIDE_NAMES[side]:<10} {ttft.size:>6,} "
                       f"{ms(np.percentile(ttft, 50)):>8} {ms(np.percentile(ttft, 99)):>7}  ")
                if side == "direct":
                    row += f"{'':>24}  {'':>24}  {'':>12} {'':>5} {'':>7}  "
                else:
                    a50, a99 = added(direct, ttft, 50, args.seed), added(direct, ttft, 99, args.seed)
                    row += (f"{f'{a50[0]:+.2f} [{a50[1]:+.2f}, {a50[2]:+.2f}]':>24}  "
                            f"{f'{a99[0]:+.2f} [{a99[1]:+.2f}, {a99[2]:+.2f}]':>24}  "
                            f"{share(got.cpu(side), got.wall):>12} {f'{100 * got.waited(side) / got.wall:.0f}%':>5} "
                            f"{1e6 * got.cpu(side).sum() / max(got.ended, 1):>7,.0f}  ")
                    if side == "recorder":
                        met.append(a50[0] <= TARGET_P50_MS and a99[0] <= TARGET_P99_MS)
                row += f"{share(got.cpu('client'), got.wall):>12} {share(got.cpu('emulator'), got.wall):>12}"
                print(row, flush=True)
            note = short_of_cpu(result)
            if note:
                print(note)
            failed = sum(got.failed for got in result.values())
            wrong = sum(got.usage_wrong for got in result.values())
            if failed or wrong:
                met[-1] = False
                print(f"         failed calls: {failed:,}; calls with a usage event they did not ask for, or "
                      f"without one they asked for: {wrong:,}")
    return met


async def capacity(args: argparse.Namespace, out: Path) -> Optional[bool]:
    """Part 2; prints its figures and returns whether the target was met."""
    pin = len(CORES) >= 2
    sides = ["direct", "recorder"] + (["bare"] if args.bare else [])
    print(f"\n2. Capacity per core: emulator with no delay (--ttft 0 --itl 0), {args.capacity_streams} streams "
          f"(calls back to back; the client does not ask for usage), {args.output_tokens} output tokens a call, "
          f"prompts as above; {args.repeats} pass(es) of {args.seconds:g} s per side; "
          + (f"client and emulator on core {CORES[0]}, proxy alone on core {CORES[-1]}." if pin
             else "one core only: nothing pinned."))
    mine = os.sched_getaffinity(0)
    with servers(args, sides, ["--ttft", "0", "--itl", "0"], out, "capacity") as (urls, pids):
        if pin:
            os.sched_setaffinity(0, {CORES[0]})
            os.sched_setaffinity(pids["emulator"], {CORES[0]})
            for side in sides[1:]:
                os.sched_setaffinity(pids[side], {CORES[-1]})
        try:
            result = await measure(sides, urls, pids, args.capacity_streams, shape_of(args, False), 0.5, args)
        finally:
            os.sched_setaffinity(0, mine)
    print(f"{'side':<10} {'calls/s':>8} {'tokens/s':>9} {'failed':>6}  {'client cpu':>12} {'emulator cpu':>12} "
          f"{'proxy cpu':>12} {'proxy wait':>10}   (cpu: share of one core over the windows, user+system)")
    rate = {}
    for side, got in result.items():
        rate[side] = got.ended / got.wall
        proxy = (share(got.cpu(side), got.wall), f"{100 * got.waited(side) / got.wall:.0f}%") if side != "direct" \
            else ("", "")
        print(f"{SIDE_NAMES[side]:<10} {rate[side]:>8,.0f} {rate[side] * args.output_tokens:>9,.0f} {got.failed:>6,}  "
              f"{share(got.cpu('client'), got.wall):>12} {share(got.cpu('emulator'), got.wall):>12} "
              f"{proxy[0]:>12} {proxy[1]:>10}")
    note = short_of_cpu(result, set(sides[1:]))  # client and emulator share a core by design: not counted
    if note:
        print(note.strip())
    for side in sides[1:]:
        got = result[side]
        cpu = got.cpu(side)
        per_call = cpu.sum() / max(got.ended, 1)
        print(f"{SIDE_NAMES[side]} CPU: {per_call * 1e6:,.0f} us per call ({cpu[0] / max(got.ended, 1) * 1e6:,.0f} user "
              f"+ {cpu[1] / max(got.ended, 1) * 1e6:,.0f} system), {per_call / args.output_tokens * 1e6:,.1f} us per "
              f"streamed token; one core of it carries {1 / per_call:,.0f} calls/s, "
              f"{args.output_tokens / per_call:,.0f} tokens/s (calls / its CPU-seconds), "
              f"{100 / per_call / rate['direct']:.0f}% of the direct calls/s")
    ratio = rate["recorder"] / rate["direct"]
    print(f"capacity through the recorder as % of direct, per core: {100 * ratio:.1f}% (calls/s completed through "
          f"the recorder, alone on one core, over calls/s completed direct; the same client and emulator on one "
          f"core in both)")
    return ratio >= TARGET_CAPACITY


def recorder_argv(args: argparse.Namespace, part: str, upstream: str, out: Path) -> list[str]:
    """How to start the recorder: ``python -m simulator record ...`` as `agentload record` runs, or through a
    small launcher that first sets uvloop's event loop (``--proxy-loop uvloop``) and runs it under cProfile
    (``--profile``)."""
    tail = ["record", "--upstream", upstream, "--listen", "127.0.0.1:0", "-o", str(out)]
    if not args.profile and args.proxy_loop == "asyncio":
        return ["-m", "simulator", *tail]
    code = ["import asyncio, runpy, sys", "sys.argv[0] = 'agentload'"]
    if args.proxy_loop == "uvloop":
        code.append("import uvloop; asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())")
    run = "runpy.run_module('simulator', run_name='__main__')"
    if args.profile:
        code.append(f"import cProfile; cProfile.run({run!r}, {str(profile_path(args, part))!r})")
    else:
        code.append(run)
    return ["-c", "\n".join(code), *tail]


@contextmanager
def servers(args: argparse.Namespace, sides: list[str], timing: list[str], folder: Path,
            part: str) -> Iterator[tuple[dict[str, str], dict[str, int]]]:
    """The emulator and the proxies of `sides` in child processes: their URLs and pids, by side (the
    emulator's pid as ``emulator``)."""
    emu_argv = ["-m", "simulator", "serve-emulator", "--host", "127.0.0.1", "--port", "0", *timing]
    recorder = None
    try:
        with python_child(*emu_argv) as (emulator_url, emulator), \
                python_child(*recorder_argv(args, part, emulator_url, folder / f"{part}.jsonl")) as (recorder_url, recorder):
            urls = {"direct": emulator_url, "recorder": recorder_url}
            pids = {"emulator": emulator.pid, "recorder": recorder.pid}
            if "bare" not in sides:
                yield urls, pids
                return
            bare_argv = [str(Path(__file__).resolve()), "--serve-bare", emulator_url, "--proxy-loop", args.proxy_loop]
            with python_child(*bare_argv) as (urls["bare"], bare):
                pids["bare"] = bare.pid
                yield urls, pids
    finally:
        if recorder is not None:  # its own tally, said when it stops (and any call it could not record)
            tally = [line for line in recorder.said.splitlines() if line.startswith(("agentload record", "  "))]
            print(f"   {part} part's recorder said (ramps and ends of passes included): "
                  + " | ".join(line.strip() for line in tally))


def profile_path(args: argparse.Namespace, part: str) -> Path:
    return args.profile.with_name(f"{args.profile.stem}-{part}{args.profile.suffix or '.prof'}")


def show_profile(part: str, path: Path, top: int) -> None:
    print(f"\nrecorder profile of the {part} part ({path}), top {top} by own time:")
    pstats.Stats(str(path)).sort_stats("tottime").print_stats(top)


async def main(args: argparse.Namespace) -> int:
    load = os.getloadavg()
    print(f"machine: {os.cpu_count()} cores ({len(CORES)} usable here), load average {load[0]:.2f} {load[1]:.2f} "
          f"{load[2]:.2f} (1, 5, 15 min) at the start; other processes on these cores weigh on the figures "
          f"(more on p99 than p50); the recorder{' and the bare proxy' if args.bare else ''} on {args.proxy_loop}'s "
          f"event loop")
    met: list[bool] = []
    cap: Optional[bool] = None
    with tempfile.TemporaryDirectory(prefix="recorder-overhead-") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        if not args.skip_latency:
            sides = ["direct", "recorder"] + (["bare"] if args.bare else [])
            with servers(args, sides, ["--ttft", str(args.ttft), "--itl", str(args.itl)], folder,
                         "latency") as (urls, pids):
                met = await latency(args, urls, pids)
        if not args.skip_capacity:
            cap = await capacity(args, folder)
    for part, skipped in (("latency", args.skip_latency), ("capacity", args.skip_capacity)):
        if args.profile and not skipped:
            show_profile(part, profile_path(args, part), args.profile_top)
    verdicts = []
    if met:
        verdicts.append(f"added TTFT p50 <= {TARGET_P50_MS} ms and p99 <= {TARGET_P99_MS} ms "
                        f"{'met' if all(met) else 'missed'} ({sum(met)} of {len(met)} rows)")
    if cap is not None:
        verdicts.append(f"capacity >= {TARGET_CAPACITY:.0%} of direct {'met' if cap else 'missed'}")
    print(f"\nload average at the end: {os.getloadavg()[0]:.2f}; targets: " + "; ".join(verdicts))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", default=[64, 256], type=lambda s: [int(x) for x in s.split(",")],
                        help="concurrent streams of the latency part, comma-separated (default: 64,256)")
    parser.add_argument("--seconds", type=float, default=4.0, help="measured seconds of each pass (default: 4)")
    parser.add_argument("--repeats", type=int, default=2, help="passes per side (default: 2)")
    parser.add_argument("--ramp", type=float,
                        help="seconds over which the latency part's streams start, not measured (default: one "
                             "call's length, at least 1 s: streams then arrive evenly spread)")
    parser.add_argument("--ttft", type=float, default=0.05, help="the emulator's fixed TTFT, s (default: 0.05)")
    parser.add_argument("--itl", type=float, default=0.01, help="the emulator's fixed ITL, s (default: 0.01)")
    parser.add_argument("--think", type=float, default=0.0,
                        help="seconds from a call's end to the stream's next call (default: 0)")
    parser.add_argument("--prompt", type=int, default=2000, help="tokens of a task's first prompt (default: 2000)")
    parser.add_argument("--shared", type=int, default=1024,
                        help="leading prompt tokens all streams share (default: 1024)")
    parser.add_argument("--grow", type=int, default=200, help="tokens a task's prompt grows by a call (default: 200)")
    parser.add_argument("--task-calls", type=int, default=10, help="calls of a task (default: 10)")
    parser.add_argument("--output-tokens", type=int, default=64, help="output tokens a call (default: 64)")
    parser.add_argument("--capacity-streams", type=int, default=64,
                        help="streams of the capacity part (default: 64)")
    parser.add_argument("--bare", action="store_true",
                        help="also measure a bare aiohttp pass-through proxy (what any such proxy costs)")
    parser.add_argument("--proxy-loop", choices=("asyncio", "uvloop"), default="asyncio",
                        help="the event loop the recorder (and the bare proxy) run on (default: asyncio, as "
                             "`agentload record` runs)")
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--skip-capacity", action="store_true")
    parser.add_argument("--profile", type=Path,
                        help="run the recorders under cProfile (it slows them: the figures are then not the "
                             "recorder's), stats to PROFILE-latency.prof and PROFILE-capacity.prof")
    parser.add_argument("--profile-top", type=int, default=25)
    parser.add_argument("--keep", type=Path, metavar="FOLDER",
                        help="write the recordings (latency.jsonl, capacity.jsonl) there and keep them")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--serve-bare", metavar="UPSTREAM", help=argparse.SUPPRESS)
    parsed = parser.parse_args()
    if parsed.serve_bare:
        if parsed.proxy_loop == "uvloop":
            import uvloop

            uvloop.run(serve_bare(parsed.serve_bare))
        else:
            asyncio.run(serve_bare(parsed.serve_bare))
        sys.exit(0)
    if parsed.ramp is None:
        parsed.ramp = max(1.0, parsed.ttft + parsed.output_tokens * parsed.itl)
    if not 0 <= parsed.shared <= parsed.prompt:
        parser.error("--shared must be between 0 and --prompt")
    sys.exit(asyncio.run(main(parsed)))
