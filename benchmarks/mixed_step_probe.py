"""A call that arrives while streams of a long context decode: its TTFT and the streams' ITL, server against twin.

Each case has B streams decode (`--output` tokens each) after their prompts of C tokens were put in the
prefix cache; 60 ms later a call of n fresh prompt tokens goes out. Its first step mixes its prefill
with the B decodes. Printed per case: the call's median TTFT over the rounds and the streams' median
ITL, on the server and on the twin of `--profile`. The twin's figure is the median over the call sent
at 24 phases 0.25 ms apart, as the server's send meets its steps at a random phase. Where the streams'
ITL agrees (pure-decode steps) but the call's TTFT does not, the mixed step is what the twin misses:
`per_mixed_context_token`, which the calibration sweep fits from its loaded points of long-context
streams. The cases alternate order every round, so that a drift of the machine reaches them alike.

    .venv/bin/python benchmarks/mixed_step_probe.py --target http://127.0.0.1:8000 --profile CAL.yaml
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys

from pathlib import Path

import aiohttp
import simpy

from simulator.sim.make_twin import make_twin
from simulator.sim.profile import load_profile
from simulator.workload import Call

sys.path.insert(0, str(Path(__file__).resolve().parent))
from wake_probe import lone_call  # noqa: E402

CASES = ((1, 64, 32), (4, 2048, 32), (8, 2048, 32), (1, 64, 512), (4, 2048, 512))
"""(streams, stream context, call prompt tokens)."""
DELAY = 0.06
"""Seconds from the streams' send to the call's."""
PHASES = [k * 0.00025 for k in range(24)]
BLOCK = 128


async def measure(url: str, rounds: int, output: int, seed: int) -> dict:
    rng = random.Random(seed)
    found: dict = {case: ([], []) for case in CASES}
    async with aiohttp.ClientSession() as session:
        async with session.get(url + "/v1/models") as resp:
            model = (await resp.json())["data"][0]["id"]
        for r in range(rounds):
            for case in (CASES if r % 2 == 0 else CASES[::-1]):
                streams, context, n = case
                prompts = [[rng.randrange(10, 1000) for _ in range(context)] for _ in range(streams)]
                await asyncio.gather(*(lone_call(session, url, model, p, 1) for p in prompts))  # cache them
                tasks = [asyncio.create_task(lone_call(session, url, model, p + [7], output)) for p in prompts]
                await asyncio.sleep(DELAY)
                ttft, _ = await lone_call(session, url, model, [rng.randrange(10, 1000) for _ in range(n)], 1)
                found[case][0].append(ttft)
                found[case][1].extend(decode / (output - 1) for _, decode in await asyncio.gather(*tasks))
    return found


def predict(profile, case: tuple[int, int, int], output: int, phase: float) -> tuple[float, float]:
    """(the call's TTFT, the streams' median ITL) on the twin for one send phase."""
    streams, context, n = case
    env = simpy.Environment()
    twin = make_twin(env, profile)
    prompts = [tuple(range(1000 * (j + 1), 1000 * (j + 1) + context // BLOCK)) for j in range(streams)]
    out: dict = {}

    def run():
        yield env.all_of([twin.submit_call(Call(context, 1, hash_ids=ids, block_size=BLOCK)) for ids in prompts])
        yield env.timeout(0.02)
        sent = [twin.submit_call(Call(context + 1, output, hash_ids=ids, block_size=BLOCK)) for ids in prompts]
        yield env.timeout(DELAY + phase)
        out["ttft"] = (yield twin.submit_call(Call(n, 1))).ttft
        done = yield env.all_of(sent)
        out["itl"] = statistics.median((c.end - c.first_token) / (output - 1) for c in done.values())

    env.process(run())
    env.run()
    return out["ttft"], out["itl"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", required=True, help="a running server (the model's context must take 2,100 tokens)")
    parser.add_argument("--profile", required=True, help="the twin's profile (calibrated on that server)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--output", type=int, default=120, help="output tokens of each stream")
    parser.add_argument("--seed", type=int, default=13)
    args = parser.parse_args()
    if args.output < 2:
        parser.error("--output must be at least 2 (the streams' gaps)")
    profile = load_profile(args.profile)
    found = asyncio.run(measure(args.target, args.rounds, args.output, args.seed))
    print(f"{args.rounds} rounds; medians; twin over {len(PHASES)} send phases")
    print(f"{'streams':>7} {'context':>7} {'call':>5} {'TTFT real ms':>13} {'twin':>7} {'ratio':>6}"
          f" {'stream ITL real ms':>19} {'twin':>7} {'ratio':>6}")
    for case in CASES:
        ttfts, itls = found[case]
        twin = [predict(profile, case, args.output, phase) for phase in PHASES]
        real_ttft, real_itl = statistics.median(ttfts), statistics.median(itls)
        twin_ttft, twin_itl = statistics.median(t for t, _ in twin), statistics.median(i for _, i in twin)
        print(f"{case[0]:7d} {case[1]:7d} {case[2]:5d} {real_ttft * 1e3:13.2f} {twin_ttft * 1e3:7.2f} "
              f"{twin_ttft / real_ttft:6.2f} {real_itl * 1e3:19.3f} {twin_itl * 1e3:7.3f} {twin_itl / real_itl:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
