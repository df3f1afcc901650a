"""Replay a request sequence against vLLM's own v1 KV cache manager; prints the figures as JSON.

Run with vLLM's Python (the ``.vllm-venv`` of scripts/install-vllm.sh), not the project's:

    .vllm-venv/bin/python tests/integration/vllm_kv_replay.py CONFIG.json

CONFIG holds ``block_size``, ``num_blocks`` (usable blocks: vLLM's pool gets one more, its null
block), ``budget`` (tokens a step), ``window`` (most requests running), ``hybrid`` (false: one
full-attention group; true: ``mamba_groups`` Mamba groups in ``--mamba-cache-mode align`` with
Mamba2's prefill checkpoint block, then one attention group, as a Nemotron-H model whose first
layer is a Mamba layer orders them), ``retention`` (``--prefix-cache-retention-interval``) and
``requests`` (see `kv_protocol.requests_from`); ``eagle`` makes the attention group an EAGLE/MTP
drafter's (hits give back a block, Mamba checkpoints a block lower). The step loop is `kv_protocol.replay`; prefill
chunks of the hybrid spec are cut by vLLM's own ``Scheduler._mamba_block_aligned_split``. No model,
no device: only ``KVCacheManager`` and the classes it builds. With ``split_cases`` instead, it
prints vLLM's chunk rule for each case (`split_cases`). With ``runs`` (names to such configs) it does
each, in one process (vLLM's import takes most of a replay's time), and prints their results by name.
"""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import kv_protocol  # noqa: E402


class VllmEngine:
    """`kv_protocol` engine over vLLM's ``KVCacheManager``."""

    def __init__(self, cfg: dict) -> None:
        import torch
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.sched.scheduler import Scheduler
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec
        from vllm.v1.request import Request, RequestStatus

        self.Request, self.SamplingParams, self.Status = Request, SamplingParams, RequestStatus
        bs = cfg["block_size"]
        self.hybrid = cfg["hybrid"]
        init_none_hash(sha256)
        attention = FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=64, dtype=torch.float16)
        groups = []
        if self.hybrid:
            mamba = MambaSpec(block_size=bs, shapes=((16,),), dtypes=(torch.float16,),
                              page_size_padded=attention.page_size_bytes, mamba_cache_mode="align",
                              num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=1)
            groups += [KVCacheGroupSpec([f"mamba.{g}"], mamba) for g in range(cfg["mamba_groups"])]
        eagle = bool(cfg.get("eagle"))
        groups.append(KVCacheGroupSpec(["attention"], attention, is_eagle_group=eagle))
        config = KVCacheConfig(num_blocks=cfg["num_blocks"] + 1, kv_cache_tensors=[], kv_cache_groups=groups,
                               prefix_cache_retention_interval=cfg.get("retention", 0))
        self.manager = KVCacheManager(config, max_model_len=1 << 22, scheduler_block_size=bs, hash_block_size=bs,
                                      enable_caching=True, use_eagle=eagle)
        self.kind = type(self.manager.coordinator).__name__
        self.hasher = get_request_block_hasher(bs, sha256)
        pool = self.manager.block_pool
        self._evicted = 0
        evict = pool._maybe_evict_cached_block

        def counted(block):  # every hashed block the pool hands out again
            evicted = evict(block)
            self._evicted += bool(evicted)
            return evicted

        pool._maybe_evict_cached_block = counted
        # The scheduler's chunk rule, on the attributes it reads (block grid, no finer prefix match).
        self.scheduler = SimpleNamespace(
            cache_config=SimpleNamespace(block_size=bs), block_size=bs, hash_block_size=bs, mamba_partial_cache_hit=False,
            use_eagle_block_drop=eagle, mamba_has_prefill_checkpoint_blocks=True,
            mamba_prefill_checkpoint_alignment=1, max_num_scheduled_tokens=cfg["budget"],
            scheduler_config=SimpleNamespace(long_prefill_token_threshold=0), mamba_shared_prefix_checkpoint=False)
        self.split = Scheduler._mamba_block_aligned_split

    def new_step(self) -> None:
        self.manager.new_step_starts()

    def _request(self, req: kv_protocol.Req):
        if req.handle is None:
            req.handle = self.Request(str(req.index), kv_protocol.prompt_tokens(req),
                                      self.SamplingParams(max_tokens=req.out), None, block_hasher=self.hasher)
        return req.handle

    def admit(self, req: kv_protocol.Req, budget: int):
        r = self._request(req)
        blocks, hit, junction = self.manager.get_computed_blocks(r)
        r.shared_prefix_boundary = junction
        n = min(r.num_tokens - hit, budget)
        if self.hybrid:
            n = self.split(self.scheduler, r, n, hit)
        if n <= 0 or self.manager.allocate_slots(r, n, hit, blocks) is None:
            return None
        r.num_computed_tokens = hit + n
        r.status = self.Status.RUNNING
        return n, hit

    def step(self, req: kv_protocol.Req, budget: int):
        r = req.handle
        if budget <= 0:
            return 0
        if req.decoding:
            n = 1
        else:
            n = min(req.target - req.computed, budget)
            if self.hybrid:
                n = self.split(self.scheduler, r, n)
            if n <= 0:
                return 0
        if self.manager.allocate_slots(r, n) is None:
            return None
        r.num_computed_tokens += n
        return n

    def sampled(self, req: kv_protocol.Req) -> None:
        req.handle.append_output_token_ids(kv_protocol.output_token(req, req.generated - 1))

    def free(self, req: kv_protocol.Req) -> None:
        self.manager.free(req.handle)
        req.handle.num_computed_tokens = 0
        req.handle.status = self.Status.PREEMPTED

    def evictions(self) -> int:
        return self._evicted

    def free_blocks(self) -> int:
        return self.manager.block_pool.get_num_free_blocks()


def split_cases(cases: list[list]) -> list[int]:
    """vLLM's own chunk rule (``Scheduler._mamba_block_aligned_split``, block grid) for each case:
    (start, tokens, prompt, num_tokens, block_size, max_prefill, eagle, junction, checkpoint block)."""
    from vllm.v1.core.sched.scheduler import Scheduler

    out = []
    for start, n, prompt, num_tokens, bs, budget, eagle, junction, internal in cases:
        scheduler = SimpleNamespace(
            cache_config=SimpleNamespace(block_size=bs), block_size=bs, hash_block_size=bs,
            mamba_partial_cache_hit=False, use_eagle_block_drop=eagle, mamba_has_prefill_checkpoint_blocks=internal,
            mamba_prefill_checkpoint_alignment=1 if internal else None, max_num_scheduled_tokens=budget,
            scheduler_config=SimpleNamespace(long_prefill_token_threshold=0), mamba_shared_prefix_checkpoint=False)
        request = SimpleNamespace(num_computed_tokens=start, num_prompt_tokens=prompt, num_tokens=num_tokens,
                                  shared_prefix_boundary=junction)
        out.append(Scheduler._mamba_block_aligned_split(scheduler, request, n))
    return out


def run(cfg: dict) -> dict:
    """One config's result: vLLM's chunk rule for its ``split_cases``, or the replay of its ``requests``."""
    from vllm import __version__

    if "split_cases" in cfg:
        return {"vllm": __version__, "chunks": split_cases(cfg["split_cases"])}
    engine = VllmEngine(cfg)
    result = kv_protocol.replay(kv_protocol.requests_from(cfg["requests"]), engine, budget=cfg["budget"],
                                window=cfg["window"])
    result["vllm"] = __version__
    result["coordinator"] = engine.kind
    return result


def main() -> None:
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    if "runs" in cfg:
        print(json.dumps({name: run(one) for name, one in cfg["runs"].items()}))
    else:
        print(json.dumps(run(cfg)))


if __name__ == "__main__":
    main()
