"""Whether the server would start a config of the space at all: a candidate it refuses is infeasible,
reported as such and never simulated.

A candidate is the space's profile with its settings laid over; it is infeasible when

- the profile refuses it (`simulator.sim.profile`): the KV pool cannot hold one sequence of
  `max_model_len` tokens (in blocks of the block size, beside one sequence's Mamba state blocks on a
  hybrid model), or the scheduler cannot take a whole prompt in one step without chunked prefill;
- vLLM's scheduler refuses it: `max_num_batched_tokens` below `max_num_seqs`
  (``SchedulerConfig.verify_max_model_len``, vllm/config/scheduler.py);
- on a hybrid model, the pool holds fewer blocks than `max_num_seqs`: each decoding sequence needs a
  block of Mamba state, and vLLM refuses to capture its full CUDA graphs, its default on a GPU
  (``CompilationConfig``, vllm/config/compilation.py: "max_num_seqs exceeds available Mamba cache blocks").

A server that starts but cannot run `max_num_seqs` sequences at once for lack of blocks is not
infeasible: it runs, with fewer at a time, as the twin simulates it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ..errors import InputError
from ..sim.profile import ServerProfile, load_profile


@dataclass(frozen=True)
class Infeasible:
    """Why a candidate cannot run."""

    reason: str
    violation: float
    """How far past the limit, as a share of it (1 where the profile refused it): above 0, the larger
    the further. The search steers away from larger violations first."""


def profile_of(source: str, overlay: dict[str, Any]) -> tuple[Optional[ServerProfile], Optional[Infeasible]]:
    """The candidate's profile (`source` with `overlay`), or why the server would not start it."""
    try:
        profile = load_profile(source, overlay or None)
    except InputError as exc:
        return None, Infeasible("; ".join(p.message for p in exc.problems), 1.0)
    why = refusal(profile)
    return (None, why) if why is not None else (profile, None)


def refusal(profile: ServerProfile) -> Optional[Infeasible]:
    """What vLLM refuses of a profile the twin takes (the module doc's last two rules), or None."""
    s = profile.scheduler
    if s.max_num_batched_tokens < s.max_num_seqs:
        return Infeasible(f"max_num_batched_tokens {s.max_num_batched_tokens:,} is below max_num_seqs "
                          f"{s.max_num_seqs:,} (vLLM's scheduler refuses it)",
                          (s.max_num_seqs - s.max_num_batched_tokens) / s.max_num_batched_tokens)
    blocks = profile.kv_cache.capacity_blocks
    if profile.kv_cache.hybrid is not None and s.max_num_seqs > blocks:
        return Infeasible(f"max_num_seqs {s.max_num_seqs:,} exceeds the pool's {blocks:,} blocks: each decoding "
                          "sequence needs a block of Mamba state (vLLM refuses to capture its CUDA graphs)",
                          (s.max_num_seqs - blocks) / blocks)
    return None
