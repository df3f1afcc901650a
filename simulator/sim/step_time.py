"""The step-time model: how long one engine step takes, from what the step computes.

    compute  = fixed + per_token * tokens + per_prefill_token * prefill_tokens
             + per_decode_seq * decode_seqs + per_context_token * context_tokens
             + per_prefill_attention * prefill_pairs
             + per_mixed_context_token * decode_context    (only in a step with a prefill chunk)
             + per_spec_token * draft_tokens + per_draft_pass * draft_passes
    schedule = schedule_fixed + schedule_per_seq * seqs
    step     = max(compute, schedule)    with asynchronous scheduling (the CPU work overlaps the GPU's)
             = compute + schedule        without

`tokens` counts every scheduled token (prefill chunks, one per decoding sequence, plus its k draft
tokens); `context_tokens` is the attended context summed over the batch (each sequence's context
length after the step), `decode_context` the part of it that decoding sequences attend; `prefill_pairs`
counts the query-key pairs of the prefill chunks (a chunk of n tokens after c computed ones:
n * c + n * (n + 1) / 2). The calibration fit (`simulator.calibration.fit`) fits these coefficients.
The profile's `request_overhead` is no step term: the twin delays each request's entry by it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .profile import ServerProfile


@dataclass(frozen=True, slots=True)
class StepTimeModel:
    """Step durations from a profile's coefficients."""

    fixed: float
    per_token: float
    per_prefill_token: float
    per_decode_seq: float
    per_context_token: float
    per_spec_token: float
    per_draft_pass: float
    per_prefill_attention: float
    per_mixed_context_token: float
    schedule_fixed: float
    schedule_per_seq: float
    async_scheduling: bool
    num_spec: int

    @classmethod
    def from_profile(cls, profile: ServerProfile) -> StepTimeModel:
        c = profile.step_time
        return cls(c.fixed, c.per_token, c.per_prefill_token, c.per_decode_seq, c.per_context_token,
                   c.per_spec_token, c.per_draft_pass, c.per_prefill_attention, c.per_mixed_context_token,
                   c.schedule_fixed, c.schedule_per_seq, profile.scheduler.async_scheduling,
                   profile.spec_decode.num_tokens)

    def duration(self, prefill_tokens: int, prefill_seqs: int, decode_seqs: int, context_tokens: float,
                 prefill_pairs: float = 0.0, decode_context: float = 0.0) -> float:
        """Seconds for one step with `prefill_tokens` over `prefill_seqs` chunks and `decode_seqs`
        decoding sequences (each with `num_spec` draft tokens), attending `context_tokens` in all
        (`decode_context` of them the decoding sequences'), its prefill chunks `prefill_pairs`
        query-key pairs."""
        compute = self.base(prefill_tokens, decode_seqs) + self.per_context_token * context_tokens
        if self.per_prefill_attention:
            compute += self.per_prefill_attention * prefill_pairs
        if prefill_tokens and self.per_mixed_context_token:
            compute += self.per_mixed_context_token * decode_context
        schedule = self.schedule(prefill_seqs + decode_seqs)
        if self.async_scheduling:
            return compute if compute > schedule else schedule
        return compute + schedule

    def base(self, prefill_tokens: int, decode_seqs: int) -> float:
        """The compute terms other than attended context."""
        k = self.num_spec
        drafts = decode_seqs * k
        return (
            self.fixed
            + self.per_token * (prefill_tokens + decode_seqs + drafts)
            + self.per_prefill_token * prefill_tokens
            + self.per_decode_seq * decode_seqs
            + self.per_spec_token * drafts
            + (self.per_draft_pass * k if decode_seqs else 0.0)
        )

    def decode_terms(self, decode_seqs: int) -> tuple[float, float, float]:
        """(base, add, floor) such that a pure-decode step of `decode_seqs` sequences attending
        `context` tokens lasts ``max(base + per_context_token * context + add, floor)``, to the bit
        what `duration` gives: with asynchronous scheduling add is 0 and floor the scheduling time,
        without it add is the scheduling time and floor -inf."""
        base = self.base(0, decode_seqs)
        schedule = self.schedule(decode_seqs)
        if self.async_scheduling:
            return base, 0.0, schedule
        return base, schedule, -math.inf

    def schedule(self, seqs: int) -> float:
        """The CPU's scheduling overhead for a step of `seqs` sequences."""
        return self.schedule_fixed + self.schedule_per_seq * seqs
