"""The calibration sweep measured on the twin: what the twin of a profile gives at each sweep point, the
model that the fit (`simulator.calibration.fit`) fits to what a server measured, and the check that the fit
recovers a profile from its own twin (`agentload calibrate --twin`)."""

from __future__ import annotations

import numpy as np
import simpy

from ..sim.make_twin import make_twin
from ..sim.profile import ServerProfile
from ..sim.twin import Twin, exact_delay
from .sweep import SweepPoint, cached_prompts, loaded_stream, probe_offsets


def measure_on_twin(point: SweepPoint, profile: ServerProfile) -> float:
    """What the twin of `profile` measures at one sweep point."""
    env = simpy.Environment()
    bs = profile.kv_cache.block_size
    if point.kind == "loaded":
        # stepped one by one: a call is sent inside a step planned before it, which a run of decode
        # steps advanced at once would not see
        return _loaded_on_twin(point, env, make_twin(env, profile, fast_decode=False), bs)
    twin = make_twin(env, profile)
    twin.requests_ended()  # the sweep's point before ended just before this one
    prompts = [()] * point.concurrency
    if point.cached:
        prompts = cached_prompts(point, bs)
        for hash_ids in prompts:
            twin.submit(point.input_tokens, 1, hash_ids, bs)
        env.run()
    if point.same_size:
        twin.submit(point.input_tokens, 1)
        env.run()
    if point.idle:
        env.run(until=env.now + point.idle)
    events = [twin.submit(point.input_tokens, point.output_tokens, hash_ids, bs) for hash_ids in prompts]
    env.run()
    done = [event.value for event in events]
    if point.kind == "prefill":
        return float(np.mean([c.ttft for c in done]))
    return float(np.mean([c.end - c.submitted for c in done]))


def _loaded_on_twin(point: SweepPoint, env: simpy.Environment, twin: Twin, bs: int) -> float:
    """A loaded point on the twin: the streams' prompts warmed, the streams sent, the calls sent
    about their offsets; the calls' mean TTFT (the streams are not waited for).

    A call's TTFT depends on where in a step it arrives (it waits for the next step, and for the API
    server when that is sending the step's tokens); on the real server the phase is random. On the
    twin each call goes in the step after the one under way at its offset, at its own phase
    (`probe_phases`), so that the calls sample the phases evenly and the value moves smoothly with the
    coefficients rather than jumping each time a step boundary crosses a call's send time."""
    prompt, output = loaded_stream(point, bs)
    streams = cached_prompts(point, bs, tokens=prompt)
    for hash_ids in streams:
        twin.submit(prompt, 1, hash_ids, bs)
    env.run()
    start = env.now
    for hash_ids in streams:
        twin.submit(prompt, output, hash_ids, bs)
    ttfts: list[float] = []

    def calls():
        sent = []
        offsets = probe_offsets(point)
        for offset, phase in zip(offsets, probe_phases(len(offsets))):
            yield env.timeout(exact_delay(env.now, start + offset))
            plan = twin.planned_step()
            if plan is not None:  # wait for the step under way to end
                yield env.timeout(exact_delay(env.now, plan[1]))
                plan = twin.planned_step()
                while plan is not None and plan[1] <= env.now:  # the next one is planned after the clients
                    yield env.timeout(0)
                    plan = twin.planned_step()
            if plan is not None:
                yield env.timeout(exact_delay(env.now, plan[0] + phase * (plan[1] - plan[0])))
            sent.append(twin.submit(point.input_tokens, point.output_tokens))
        for event in sent:
            ttfts.append((yield event).ttft)

    env.run(until=env.process(calls()))
    return float(np.mean(ttfts))


def probe_phases(count: int) -> list[float]:
    """Where in a step each of `count` calls lands on the twin: the middles of `count` equal parts of
    the step, in an order that spreads them over the point's time (bit-reversed for a power of two)."""
    bits = max(1, (count - 1).bit_length())
    order = sorted(range(count), key=lambda k: int(format(k, f"0{bits}b")[::-1], 2))
    return [(k + 0.5) / count for k in order]
