"""How much slower a server runs right after sitting idle: lone calls sent after each of several pauses.

Each round sends one call after every pause in turn (the order reversed every other round, so that a
drift of the machine's speed reaches every pause alike): a fresh prompt of `--prompt` random token
ids, `--output` tokens out. Printed per pause: the median TTFT (its first step pays the wake-up,
`idle_wake`) and the median decode time from the first token to the last, per token and against the
back-to-back pause (0): the slowdown of the steps while the server warms up (`wake_slowdown` over
`wake_period`). Run it at several `--output` lengths to see how long the warm-up lasts: the decode's
excess grows with its length while the steps are slow and stops growing once they are at speed.

    .venv/bin/python benchmarks/wake_probe.py --target http://127.0.0.1:8000 --output 96
    .venv/bin/python benchmarks/wake_probe.py --pauses 0,0.02,0.05,0.1,0.3,1 --output 48   # start a server
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from twin_accuracy import server  # noqa: E402


async def lone_call(session: aiohttp.ClientSession, url: str, model: str, prompt: list[int],
                    output: int) -> tuple[float, float]:
    """(TTFT, first token to last) in seconds of one streamed completion."""
    body = {"model": model, "prompt": prompt, "max_tokens": output, "min_tokens": output, "ignore_eos": True,
            "temperature": 0, "stream": True}
    sent = time.perf_counter()
    first = last = None
    async with session.post(url + "/v1/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.content:
            if line.startswith(b"data: {") and json.loads(line[6:]).get("choices"):
                last = time.perf_counter()
                first = first or last
    if first is None:
        raise RuntimeError("the server streamed no tokens")
    return first - sent, last - first


async def probe(url: str, pauses: list[float], prompt: int, output: int, rounds: int, seed: int) -> None:
    rng = random.Random(seed)
    times: dict[float, list[tuple[float, float]]] = {p: [] for p in pauses}
    async with aiohttp.ClientSession() as session:
        async with session.get(url + "/v1/models") as resp:
            model = (await resp.json())["data"][0]["id"]
        await lone_call(session, url, model, [1] * prompt, output)  # warm the server up
        for r in range(rounds):
            for pause in (pauses if r % 2 == 0 else pauses[::-1]):
                await asyncio.sleep(pause)
                ids = [rng.randrange(10, 1000) for _ in range(prompt + rng.randrange(0, 9))]
                times[pause].append(await lone_call(session, url, model, ids, output))
    base = statistics.median(d for _, d in times[pauses[0]])
    print(f"{rounds} lone calls per pause, ~{prompt} prompt tokens, {output} out (medians)")
    print(f"{'pause s':>8} {'TTFT ms':>9} {'decode ms':>10} {'per token ms':>13} {'vs first pause':>15}")
    for pause in pauses:
        ttft = statistics.median(t for t, _ in times[pause])
        decode = statistics.median(d for _, d in times[pause])
        print(f"{pause:8.3f} {ttft * 1e3:9.2f} {decode * 1e3:10.2f} {decode / (output - 1) * 1e3:13.3f} "
              f"{(decode - base) * 1e3:+12.2f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", help="a running server (default: start the tiny model on vLLM's CPU build)")
    parser.add_argument("--model-dir", default=str(Path(__file__).resolve().parents[1] / ".cache" / "agentload" / "tiny-llama"),
                        help="tiny model folder (built when missing)")
    parser.add_argument("--pauses", default="0,0.3", help="seconds of quiet before each call, the first the reference")
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--output", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=24)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.output < 2:
        parser.error("--output must be at least 2 (a decode after the first token)")
    pauses = [float(p) for p in args.pauses.split(",")]
    with server(args) as url:
        asyncio.run(probe(url, pauses, args.prompt, args.output, args.rounds, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
