"""A workload for twin tests: conversations over a shared system prompt whose prompt grows turn by turn
(prefix hits within a conversation and across them), arriving at random."""

from __future__ import annotations

import numpy as np

from simulator.workload import Call, Task, Workload


def conversations(seed: int, tasks: int, max_output: int, arrival_span: float) -> Workload:
    """`tasks` conversations of 2 to 5 calls over a 20-block (320-token) system prompt, each call adding
    2 to 11 blocks of 16 tokens and asking for 1 to `max_output` - 1 tokens, arriving within
    `arrival_span` seconds; the same `seed` gives the same workload."""
    rng = np.random.default_rng(seed)
    system = tuple(range(1, 21))
    out, next_id = [], 10**6
    for i in range(tasks):
        ids, calls = system, []
        for _ in range(int(rng.integers(2, 6))):
            fresh = int(rng.integers(2, 12))
            ids = ids + tuple(range(next_id, next_id + fresh))
            next_id += fresh
            calls.append(Call(len(ids) * 16 + int(rng.integers(0, 16)), int(rng.integers(1, max_output)),
                              gap=float(rng.choice([0.0, 0.05, 0.5])), hash_ids=ids, block_size=16))
        out.append(Task(f"t{i}", tuple(calls), arrival=float(rng.uniform(0, arrival_span))))
    return Workload(tuple(sorted(out, key=lambda t: t.arrival)))
