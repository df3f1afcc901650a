"""The server twin's record of one request: where it stands in the engine, and the figures its
completion reports. `Twin.submit_call_raw` resolves its event with this record itself."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Generic, Optional, TypeVar

import simpy

from .kv_cache import Holding

HoldingT = TypeVar("HoldingT", bound=Holding)
"""The class a request's blocks are recorded in (`Holding`, or a hybrid cache's `HybridHolding`)."""


@dataclass(slots=True, eq=False)
class TwinRequest(Generic[HoldingT]):
    """One request in a `simulator.sim.twin.Twin`. Times are SimPy times (seconds).

    A member of the decode group (`in_group`) keeps its token counts and gap figures as offsets from
    the group's shared counters; its own `generated`, `computed`, `itl_count`, `itl_max`,
    `last_token`, `gaps` and `hold` counts lag until the group settles it (see
    `simulator.sim.decode_group`). Once the request ended they are all exact."""

    prompt: int
    """Prompt tokens."""
    target: int
    """Output tokens to generate (at least 1)."""
    hold: HoldingT
    """Its KV blocks."""
    submitted: float
    """When it was submitted (its TTFT and end count from here)."""
    event: Optional[simpy.Event]
    """Resolved when it ends (set to None then, with `raw`)."""
    tag: Any
    """The submitter's tag, passed back in its `Completion`."""
    gaps: Optional[list[float]]
    """Every inter-token gap so far, when the twin keeps them (`keep_gaps`), else None."""
    raw: bool = False
    """Resolve `event` with this record rather than a `Completion`."""
    generated: int = field(default=0, init=False)
    """Output tokens emitted."""
    computed: int = field(default=0, init=False)
    """Tokens whose KV is computed (prompt and output; back to 0 on preemption)."""
    prefill_len: int = field(default=0, init=False)
    """Tokens to compute before it decodes (set at each admission: the prompt plus what it had
    generated before a preemption)."""
    decoding: bool = field(default=False, init=False)
    """Its prefill is done: it takes 1 + k tokens a step."""
    first_token: Optional[float] = field(default=None, init=False)
    """When its first token was emitted."""
    last_token: float = field(default=0.0, init=False)
    """When its latest token was emitted (its end, once ended)."""
    itl_count: int = field(default=0, init=False)
    """Inter-token gaps (steps emitting tokens after the first)."""
    itl_max: float = field(default=0.0, init=False)
    """Largest inter-token gap (0.0 while there is none)."""
    cached_tokens: Optional[int] = field(default=None, init=False)
    """Prompt tokens the prefix cache served at its first admission (None before it)."""
    preemptions: int = field(default=0, init=False)
    seq: int = field(default=0, init=False)
    """Admission order (the running set's order)."""
    in_group: bool = field(default=False, init=False)
    """Whether it is a member of the decode group now."""
    a: int = field(default=0, init=False)
    """In the group: computed tokens less the group's `tokens`."""
    b: int = field(default=0, init=False)
    """In the group: generated tokens less the group's `tokens`."""
    t_join: int = field(default=0, init=False)
    """In the group: the group's `steps` when it joined."""
    u_join: int = field(default=0, init=False)
    """In the group: the group's `units` when it joined."""
    keyed: int = field(default=0, init=False)
    """In the group: its keyed (prefix-cache) blocks, which do not grow while it is a member."""
