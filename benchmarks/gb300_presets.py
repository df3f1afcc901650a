"""The GB300 / Nemotron 3.5 Super VL presets against the published throughput figures.

Each preset is one step of the published tuning sequence (a base profile plus overlays); the twin runs
the published shape (512 tokens in, 512 out, 256 concurrent streams, closed loop) on each and prints
its predicted output throughput against the figure. tests/test_twin_profile.py checks the 5% bound.

    .venv/bin/python benchmarks/gb300_presets.py [--rounds 8]
"""

from __future__ import annotations

import argparse
import time

from simulator.sim.profile import load_profile
from simulator.sim.shapes import fixed_shape_throughput

STEPS = (
    ("gb300-nemotron-super-default", "vLLM defaults", 6058),
    ("gb300-nemotron-super-mtp3", "+ MTP, 3 tokens", 7000),
    ("gb300-nemotron-super-async-fi", "+ async scheduling, FlashInfer Mamba", 7800),
    ("gb300-nemotron-super-mtp1", "MTP reduced to 1 token", 9500),
    ("gb300-nemotron-super-fp16-state", "+ FP16 Mamba state (stochastic rounding)", 11840),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8, help="requests per stream")
    args = parser.parse_args()
    print(f"{'preset':34s} {'step':42s} {'published':>10s} {'twin':>8s} {'error':>7s}  "
          f"{'TTFT ms':>8s} {'ITL ms':>7s} {'wall s':>6s}")
    worst = 0.0
    for name, step, published in STEPS:
        start = time.perf_counter()
        r = fixed_shape_throughput(load_profile(name), 256, 512, 512, rounds=args.rounds)
        wall = time.perf_counter() - start
        error = r.output_tokens_per_s / published - 1
        worst = max(worst, abs(error))
        print(f"{name:34s} {step:42s} {published:10,d} {r.output_tokens_per_s:8,.0f} {error:+7.1%}  "
              f"{r.mean_ttft * 1e3:8.1f} {r.mean_itl * 1e3:7.2f} {wall:6.2f}")
    print(f"largest error {worst:.1%} (bound: 5%)")


if __name__ == "__main__":
    main()
