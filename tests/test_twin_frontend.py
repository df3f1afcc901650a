"""The twin's API server: one worker, first come first served, that takes new requests and sends every
step's tokens (`frontend_per_output_token`); at 0 the twin gives the records it gave before the term."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import simpy

from simulator.sim.make_twin import make_twin
from simulator.sim.profile import profile_from_dict

GOLDEN = Path(__file__).resolve().parent / "fixtures" / "twin_golden"
sys.path.insert(0, str(GOLDEN))
from make_twin_golden import EXPECTED, cases, line, profiles  # noqa: E402

STEP = 0.01
"""Every step of `profile` lasts this long, whatever it holds."""


def profile(**step_time):
    return profile_from_dict({
        "scheduler": {"max_num_seqs": 256, "max_num_batched_tokens": 4096, "max_model_len": 4096},
        "kv_cache": {"block_size": 16, "num_blocks": 10000},
        "step_time": {"fixed": STEP, **step_time},
    })


def probe(streams: int, at: float, **step_time):
    """`streams` requests decoding 200 tokens from time 0, and a one-token call sent at `at`: its
    completion, the streams' completions and the twin's counters."""
    env = simpy.Environment()
    twin = make_twin(env, profile(**step_time))
    running = [twin.submit(1, 200) for _ in range(streams)]
    short = []

    def send():
        yield env.timeout(at)
        short.append((yield twin.submit(32, 1)))

    env.process(send())
    env.run()
    return short[0], [e.value for e in running], twin.stats


@pytest.mark.parametrize("case", range(len(cases())))
def test_without_per_token_work_the_twin_gives_the_records_it_gave_before(case):
    name, seed, fast = cases()[case]
    golden = EXPECTED.read_text().splitlines()[case]
    assert line(name, seed, fast, profiles()[name]) == golden, (name, seed, fast)


@pytest.mark.parametrize("streams", [4, 16, 64])
def test_a_short_calls_first_token_waits_for_the_tokens_of_its_step(streams):
    # The streams prefill in the step from 0 to STEP, then decode a token a step. A call sent at 5.75
    # steps, when the API server has sent the step before's tokens, reaches the engine for the step
    # from 6 to 7; its first token leaves the API server after that step's tokens: the streams' and
    # its own, (streams + 1) * c after the step's end.
    c = 5e-5
    at = 5.75 * STEP
    alone, _, _ = probe(streams, at)
    loaded, _, _ = probe(streams, at, frontend_per_output_token=c)
    assert alone.ttft == pytest.approx(7 * STEP - at)
    assert loaded.ttft - alone.ttft == pytest.approx((streams + 1) * c, rel=1e-9)


def test_a_request_arriving_while_the_api_server_sends_tokens_waits_its_turn():
    # The API server takes each request for 4 ms: the 64 streams reach the engine one by one over
    # 256 ms, the first at 4 ms, when the engine starts stepping; from 264 ms all 64 decode. The tokens
    # of the steps until then queue behind those intakes, and from about 0.5 s the API server is busy
    # for only 6.4 ms after each step's end. A call sent 1 ms after a step's end is then taken at 6.4 ms,
    # and its 4 ms of intake end after the next step began: it waits a step more.
    c, intake = 1e-4, 4e-3
    step_end = intake + 80 * STEP
    at = step_end + 0.001
    before, _, _ = probe(64, at, frontend_per_request=intake)
    after, _, _ = probe(64, at, frontend_per_request=intake, frontend_per_output_token=c)
    # without per-token work: taken at once, in the engine from the next step, first token a step later
    assert before.ttft == pytest.approx(step_end + 2 * STEP - at, rel=1e-9)
    # with it: in the engine a step later, its first token sent after the 64 streams' of that step
    assert after.ttft == pytest.approx(step_end + 3 * STEP + 65 * c - at, rel=1e-9)


def test_a_saturated_api_server_slows_the_streams_delivery_but_not_the_engine():
    # 64 tokens of 0.5 ms a step: 32 ms of sending per 10 ms step; the streams see a token every 32 ms
    idle, idle_streams, idle_stats = probe(64, 0.5)
    busy, busy_streams, busy_stats = probe(64, 0.5, frontend_per_output_token=5e-4)
    assert all(s.itl_mean == pytest.approx(STEP) for s in idle_streams)
    assert all(s.itl_mean == pytest.approx(64 * 5e-4, rel=0.01) for s in busy_streams)
    assert busy_stats.steps == idle_stats.steps and busy_stats.busy_time == idle_stats.busy_time
    # the short call, sent at 0.5 s, queues behind every token sent before it
    assert busy.ttft > 10 * idle.ttft
    assert max(s.end for s in busy_streams) == pytest.approx(200 * 64 * 5e-4, rel=0.01)


def test_a_requests_end_is_its_last_tokens_delivery():
    env = simpy.Environment()
    twin = make_twin(env, profile(frontend_per_output_token=1e-3))
    done = twin.submit(16, 3)
    env.run()
    end = done.value
    # prefill step and two decode steps, each token sent 1 ms after its step's end
    assert end.first_token == pytest.approx(STEP + 1e-3)
    assert end.end == pytest.approx(3 * STEP + 1e-3) and env.now == pytest.approx(end.end)
    assert end.itl_mean == pytest.approx(STEP)


@pytest.mark.parametrize("at", [0.049, 0.052])
def test_intake_work_while_the_engine_steps_stretches_its_steps_by_the_contention(at):
    # The stream's own 4 ms intake ends at 4 ms, while the engine is idle: no cost. It then steps every
    # 10 ms from 4 ms. The call's intake runs 4 ms from `at`: inside the step from 44 to 54 ms, after
    # that step was planned, so the next step pays for it (at 49 ms); or half inside that step and half
    # inside the next, which sees it coming and pays for both halves (at 52 ms). Either way the engine
    # loses contention times 4 ms once.
    c, intake = 1.5, 4e-3
    plain, plain_streams, plain_stats = probe(1, at, frontend_per_request=intake)
    shared, shared_streams, shared_stats = probe(1, at, frontend_per_request=intake, frontend_contention=c)
    assert shared_stats.busy_time - plain_stats.busy_time == pytest.approx(c * intake, rel=1e-9)
    assert shared_streams[0].end - plain_streams[0].end == pytest.approx(c * intake, rel=1e-9)
    assert shared_stats.steps == plain_stats.steps
    assert shared.ttft - plain.ttft == pytest.approx(c * intake, rel=1e-9)


def test_intake_work_while_the_engine_is_idle_costs_it_nothing():
    env = simpy.Environment()
    twin = make_twin(env, profile(frontend_per_request=4e-3, frontend_contention=2.0))
    done = twin.submit(16, 3)
    env.run()
    assert done.value.first_token == pytest.approx(4e-3 + STEP)
    assert twin.stats.busy_time == pytest.approx(3 * STEP)
