"""The calibration sweep (`simulator.calibration.sweep`) measured on a live server: each point's burst of
requests sent over HTTP, in shuffled rounds. This module only times the server; what it could not
measure is sorted out by `simulator.calibration.usable`, and the fit is `simulator.calibration.fit`.

A measurement that cannot be taken (a call of it failed, or an answer had no first token to time) is
missed, with the reason, and the sweep goes on: a point keeps the rounds that measured it, a point
that no round measured is left out of the fit, and the fit goes ahead unless too little is left. Only
a server that cannot be reached at all ends the sweep at once."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Callable, Optional, Sequence

import numpy as np

from ..behaviour import CallRequest
from ..errors import InputError
from ..live.client import Client, Target
from ..live.prompts import stable_id
from ..metrics.records import CallRecord
from ..redact import mask_url
from ..sim.profile import SchedulerSettings
from ..workload import Call
from .sweep import SweepPoint, cached_prompts, loaded_stream, probe_offsets


async def measure_sweep(
    target: Target,
    points: Sequence[SweepPoint],
    *,
    block_size: int,
    scheduler: SchedulerSettings,
    repeat: int = 3,
    seed: int = 0,
    on_round: Optional[Callable[[int], None]] = None,
    on_missed: Optional[Callable[[int, int, str], None]] = None,
) -> list[list[Optional[float]]]:
    """Each point's `repeat` measurements (seconds), in round order: its TTFT (prefill), mean end-to-end
    latency (decode) or its calls' mean TTFT under load (loaded); None for a measurement that could not
    be taken (a call failed, or an answer had no first token), of which `on_missed(point index, round
    from 1, why)` is told. Every round measures each point once, after one warm-up burst, and
    `on_round(n)` is told when round n (from 1) is done. A cached point's prompts are made of
    `block_size` blocks (the server's); the server's `scheduler` settings bound how far prompt lengths
    move (`fresh_length`). InputError when the server cannot be reached."""
    # Each round measures the points in a new seeded random order: a drift of the server's speed (other
    # work on a shared machine) spreads over all terms instead of biasing the terms measured last.
    rng = np.random.default_rng(seed)
    # The nonce keeps prompts unique across runs against one server: no prefix-cache hits, but for a
    # cached point's own warm-up.
    nonce = f"{os.getpid()}-{time.time_ns()}"
    samples: list[list[Optional[float]]] = [[] for _ in points]
    sent: set[int] = set()
    async with Client(target, time.perf_counter()) as client:
        async def burst(point: SweepPoint, key: str) -> float:
            return await _burst(client, point, key, block_size, fresh_length(point, rng, scheduler, sent))

        try:
            await burst(points[0], f"calibrate-{nonce}--1-0")  # warm-up
        except _Missed:
            pass  # untimed: only its work on the server matters
        for attempt in range(repeat):
            for index in rng.permutation(len(points)):
                key = f"calibrate-{nonce}-{index}-{attempt}"
                try:
                    value: Optional[float] = await burst(points[index], key)
                except _Missed as missed:
                    value = None
                    if on_missed is not None:
                        on_missed(int(index), attempt + 1, str(missed))
                samples[index].append(value)
            if on_round is not None:
                on_round(attempt + 1)
    return samples


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


class _Missed(Exception):
    """A measurement that could not be taken this time; its text says why."""


async def _burst(client: Client, point: SweepPoint, key: str, block_size: int, prompt: int) -> float:
    """Send the point's burst once, its requests of `prompt` tokens (a cached point's prompts once more
    before, untimed; a same-size point's one request of its size); its value. `_Missed` when a call
    failed or an answer had no first token to time."""
    if point.kind == "loaded":
        return await _loaded(client, point, key, block_size)
    calls = [Call(prompt, point.output_tokens)] * point.concurrency
    if point.same_size:
        size = [CallRequest(f"{key}-size", "calibrate", 0, Call(point.input_tokens, 1))]
        _check(client, await _send_all(client, size), "the untimed request of its size")
    if point.cached:
        prompts = cached_prompts(point, block_size, first=stable_id(key) & ((1 << 62) - 1))
        calls = [Call(point.input_tokens, point.output_tokens, hash_ids=ids, block_size=block_size)
                 for ids in prompts]
        warm = [CallRequest(f"{key}-warm-{i}", "calibrate", 0,
                            Call(point.input_tokens, 1, hash_ids=ids, block_size=block_size))
                for i, ids in enumerate(prompts)]
        _check(client, await _send_all(client, warm), "the untimed warm-up")
    requests = [CallRequest(f"{key}-{i}", "calibrate", 0, call) for i, call in enumerate(calls)]
    if point.idle:
        await asyncio.sleep(point.idle)  # a pause to time: nothing else runs on this loop meanwhile
    records = _check(client, await _send_all(client, requests), "the burst")
    if point.kind == "prefill":
        return _mean_ttft(records)
    # End to end, not per chunk: a busy API server merges tokens into one chunk, which moves the first
    # token late and shortens the gaps, but not the end.
    return sum(r.latency for r in records) / len(records)


async def _loaded(client: Client, point: SweepPoint, key: str, block_size: int) -> float:
    """A loaded point once: its streams' prompts warmed (untimed), the streams sent, the calls sent at
    their offsets from then; the calls' mean TTFT, once the streams have ended too (`_Missed` when a
    stream or a call failed: the calls then did not meet the load the point means)."""
    prompt, output = loaded_stream(point, block_size)
    prompts = cached_prompts(point, block_size, first=stable_id(key) & ((1 << 62) - 1), tokens=prompt)
    warm = [CallRequest(f"{key}-warm-{i}", "calibrate", 0, Call(prompt, 1, hash_ids=ids, block_size=block_size))
            for i, ids in enumerate(prompts)]
    _check(client, await _send_all(client, warm), "the streams' untimed warm-up")
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
        streamed = await streams  # the next point starts on an idle server
    _check(client, streamed, "the streams")
    return _mean_ttft(_check(client, records, "the calls under load"))


async def _send_all(client: Client, requests: list[CallRequest]) -> list[CallRecord]:
    """Send the requests at once; their records, once all have ended (a client never raises for a
    server's fault: a failed call is a record with ``ok=False``)."""
    now = time.perf_counter() - client.t0
    return [record for record, _ in await asyncio.gather(*(client.send(r, now) for r in requests))]


def _check(client: Client, records: list[CallRecord], what: str) -> list[CallRecord]:
    """`records` when all succeeded; `_Missed` saying which failed and how, or InputError when the
    server could not be reached (nothing more can be measured)."""
    failed = [r for r in records if not r.ok]
    if not failed:
        return records
    unreachable = [r for r in failed if r.error_class == "connect"]
    first = (unreachable or failed)[0]
    text = f"{len(failed)} of {len(records)} calls of {what} failed ({first.error_class}: {first.error_message})"
    if unreachable:
        raise InputError(f"calibration stopped, the server cannot be reached: {text}",
                         file=mask_url(client.target.base_url))
    raise _Missed(text)


def _mean_ttft(records: list[CallRecord]) -> float:
    """The calls' mean time to first token; `_Missed` when an answer had none (no token arrived)."""
    timed = [r.ttft for r in records if r.ttft is not None]
    if len(timed) < len(records):
        raise _Missed(f"{len(records) - len(timed)} of {len(records)} answers had no first token to time")
    return sum(timed) / len(timed)
