"""The calibration sweep (`simulator.sim.calibrate`) measured on a live server: each point's burst of
requests sent over HTTP, in shuffled rounds. The fit itself is the twin's (`simulator.sim.calibrate.fit`);
this module only times the server."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Callable, Optional, Sequence

import numpy as np

from ..behaviour import CallRequest
from ..errors import InputError
from ..metrics.records import CallRecord
from ..sim.calibrate import DRIFT_WARNING, SweepPoint, cached_prompts, loaded_stream, probe_offsets
from ..sim.profile import SchedulerSettings
from ..workload import Call
from .client import Client, Target
from .prompts import stable_id


async def measure_sweep(
    target: Target,
    points: Sequence[SweepPoint],
    *,
    block_size: int,
    scheduler: SchedulerSettings,
    repeat: int = 3,
    seed: int = 0,
    on_round: Optional[Callable[[int], None]] = None,
) -> list[list[float]]:
    """Each point's `repeat` measurements (seconds): its TTFT (prefill), mean end-to-end latency
    (decode) or its calls' mean TTFT under load (loaded). Every round measures each point once, after one
    warm-up burst, and `on_round(n)` is told when round n (from 1) is done. A cached point's prompts are
    made of `block_size` blocks (the server's); the server's `scheduler` settings bound how far prompt
    lengths move (`fresh_length`). InputError at the first call that fails."""
    # Each round measures the points in a new seeded random order: a drift of the server's speed (other
    # work on a shared machine) spreads over all terms instead of biasing the terms measured last.
    rng = np.random.default_rng(seed)
    # The nonce keeps prompts unique across runs against one server: no prefix-cache hits, but for a
    # cached point's own warm-up.
    nonce = f"{os.getpid()}-{time.time_ns()}"
    samples: list[list[float]] = [[] for _ in points]
    sent: set[int] = set()
    async with Client(target, time.perf_counter()) as client:
        async def burst(point: SweepPoint, key: str) -> float:
            return await _burst(client, point, key, block_size, fresh_length(point, rng, scheduler, sent))

        await burst(points[0], f"calibrate-{nonce}--1-0")  # warm-up
        for attempt in range(repeat):
            for index in rng.permutation(len(points)):
                key = f"calibrate-{nonce}-{index}-{attempt}"
                samples[index].append(await burst(points[index], key))
            if on_round is not None:
                on_round(attempt + 1)
    return samples


def round_speeds(samples: Sequence[Sequence[float]]) -> list[float]:
    """Each round's time relative to the points' medians (the median over points of a round's
    measurement over its point's median): 1.0 everywhere when the server kept its speed, a trend when it
    drifted over the sweep (other work on its CPUs, a shared host's neighbours)."""
    ratios = np.array([np.asarray(s, dtype=float) / np.median(s) for s in samples])
    return [float(r) for r in np.median(ratios, axis=0)]


def rounds_text(speeds: Sequence[float], trend: Optional[float]) -> str:
    """The rounds' relative times and their trend in one line, as `calibrate` prints them."""
    return ("rounds' times over the points' medians: " + "  ".join(f"{v:.3f}" for v in speeds)
            + f" (trend {trend_text(trend)})")


def trend_text(trend: Optional[float]) -> str:
    """A `speed_trend` as text ('n/a' without one)."""
    return "n/a" if trend is None else f"{trend:+.1%}"


def drift_warning(trend: Optional[float]) -> Optional[str]:
    """What a trend past DRIFT_WARNING means (None within it, or without a trend)."""
    if trend is None or abs(trend) <= DRIFT_WARNING:
        return None
    return (f"the server's speed drifted {trend:+.1%} over the sweep (other work on its CPUs, a shared "
            "host's neighbours): each point's median mixes speeds, and terms that few points tell apart "
            "can move by more")


def speed_trend(speeds: Sequence[float]) -> Optional[float]:
    """The change of the rounds' times from the first round to the last along their least-squares line
    (−0.08: the server ran 8% faster by the end); None with fewer than 3 rounds, too few for a trend."""
    if len(speeds) < 3:
        return None
    slope, intercept = np.polyfit(np.arange(len(speeds)), speeds, 1)
    return float(slope * (len(speeds) - 1) / intercept)


FRESH_SPREAD = 16
"""An uncached point's prompt length moves by up to this many tokens either way each time it is sent,
to a length the sweep has not sent yet while there is one: the kernels a length's step builds stay in
oneDNN's cache for the next hundred-odd sizes (`shape_cache`), longer than a sweep round."""


def fresh_length(point: SweepPoint, rng: np.random.Generator, scheduler: SchedulerSettings,
                 sent: Optional[set[int]] = None) -> int:
    """The prompt length to send for `point` this time. A step of a size the server ran lately finds its
    kernels built, one of a new size builds them (`per_new_shape`); agent traffic's prefills are of new
    sizes all the time, and so are the sweep's but those of a same-size point and prompts too short to
    move, each time a few tokens longer or shorter. The moves are symmetric, so the median over the
    repeats is the nominal length's, which the twin takes; but a move never makes the prompt and its
    output exceed the server's `max_model_len`, nor the burst's prefill take another chunk of
    `max_num_batched_tokens` (another step, which the nominal length does not take): it goes the
    other way then, or the length stays. With `sent` (the lengths sent so far, which the length sent
    joins), a move to a length not sent yet, while one is left."""
    p = point.input_tokens
    if point.cached or point.same_size or p <= 2 * FRESH_SPREAD:
        return p

    def chunks(length: int) -> int:
        return -(-point.concurrency * length // scheduler.max_num_batched_tokens)

    moves = [d for d in range(-FRESH_SPREAD, FRESH_SPREAD + 1) if d]
    if sent:
        moves = [d for d in moves if p + d not in sent] or moves
    move = int(rng.choice(moves))
    length = p
    for moved in (p + move, p - move):
        if moved + point.output_tokens <= scheduler.max_model_len and chunks(moved) == chunks(p):
            length = moved
            break
    if sent is not None:
        sent.add(length)
    return length


async def _burst(client: Client, point: SweepPoint, key: str, block_size: int, prompt: int) -> float:
    """Send the point's burst once, its requests of `prompt` tokens (a cached point's prompts once more
    before, untimed; a same-size point's one request of its size); its value."""
    if point.kind == "loaded":
        return await _loaded(client, point, key, block_size)
    calls = [Call(prompt, point.output_tokens)] * point.concurrency
    if point.same_size:
        await _send_all(client, [CallRequest(f"{key}-size", "calibrate", 0, Call(point.input_tokens, 1))])
    if point.cached:
        prompts = cached_prompts(point, block_size, first=stable_id(key) & ((1 << 62) - 1))
        calls = [Call(point.input_tokens, point.output_tokens, hash_ids=ids, block_size=block_size)
                 for ids in prompts]
        await _send_all(client, [CallRequest(f"{key}-warm-{i}", "calibrate", 0,
                                             Call(point.input_tokens, 1, hash_ids=ids, block_size=block_size))
                                 for i, ids in enumerate(prompts)])
    requests = [CallRequest(f"{key}-{i}", "calibrate", 0, call) for i, call in enumerate(calls)]
    if point.idle:
        await asyncio.sleep(point.idle)  # a pause to time: nothing else runs on this loop meanwhile
    records = await _send_all(client, requests)
    if point.kind == "prefill":
        return sum(r.ttft for r in records) / len(records)
    # End to end, not per chunk: a busy API server merges tokens into one chunk, which moves the first
    # token late and shortens the gaps, but not the end.
    return sum(r.latency for r in records) / len(records)


async def _loaded(client: Client, point: SweepPoint, key: str, block_size: int) -> float:
    """A loaded point once: its streams' prompts warmed (untimed), the streams sent, the calls sent at
    their offsets from then; the calls' mean TTFT, once the streams have ended too."""
    prompt, output = loaded_stream(point, block_size)
    prompts = cached_prompts(point, block_size, first=stable_id(key) & ((1 << 62) - 1), tokens=prompt)
    await _send_all(client, [CallRequest(f"{key}-warm-{i}", "calibrate", 0,
                                         Call(prompt, 1, hash_ids=ids, block_size=block_size))
                             for i, ids in enumerate(prompts)])
    began = time.perf_counter()
    streams = asyncio.ensure_future(_send_all(client, [
        CallRequest(f"{key}-{i}", "calibrate", 0, Call(prompt, output, hash_ids=ids, block_size=block_size))
        for i, ids in enumerate(prompts)]))

    async def call(k: int, offset: float) -> CallRecord:
        await asyncio.sleep(max(0.0, began + offset - time.perf_counter()))  # a send time, not a wait for work
        (record,) = await _send_all(client, [CallRequest(f"{key}-call-{k}", "calibrate", 0,
                                                         Call(point.input_tokens, point.output_tokens))])
        return record

    try:
        records = await asyncio.gather(*(call(k, offset) for k, offset in enumerate(probe_offsets(point))))
    finally:
        await streams  # the next point starts on an idle server (and a failed stream is reported)
    return sum(r.ttft for r in records) / len(records)


async def _send_all(client: Client, requests: list[CallRequest]) -> list[CallRecord]:
    """Send the requests at once; their records, InputError at the first that failed."""
    now = time.perf_counter() - client.t0
    records = [record for record, _ in await asyncio.gather(*(client.send(r, now) for r in requests))]
    for r in records:
        if not r.ok:
            raise InputError(f"calibration call failed: {r.error_class}: {r.error_message}",
                             file=client.target.base_url)
    return records
