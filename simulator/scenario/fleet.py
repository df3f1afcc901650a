"""A fleet in a scenario or a study: N replicas behind a router (the scenario's ``fleet`` section).

Live, each replica is a server agentload launches (the built-in emulator, vLLM, any command) or an
existing URL, and the router is `sglang-router` launched with the section's policy and settings, or an
existing router URL. On the twin, each replica is the twin of `profile` and the router is the policy
object of the same name (`simulator.fleet.policies`), which also knows policies the live router lacks.

Conventions a fleet run relies on:

- `REPLICA_HEADER`: a replica names itself in this response header (the built-in emulator does, with
  its ``replica`` setting); the client records it in each call record's ``replica``.
- Session keys: each call carries its session's key (the top-level task's id, or with
  ``session.sub_agents: own`` its own task's id) in the header `SessionSpec.header` (by default the
  routing-key header of sglang-router's ``manual`` policy) and/or the OpenAI ``user`` field.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..emulator.settings import REPLICA_HEADER as REPLICA_HEADER  # defined beside the emulator's `replica`
from ..server_commands import ServerCommand, VLLMCommand

ROUTING_KEY_HEADER = "x-smg-routing-key"
"""The header sglang-router's ``manual`` policy (and its sticky sessions) reads a routing key from."""
LIVE_POLICIES = ("random", "round_robin", "cache_aware", "power_of_two", "manual")
"""The policies sglang-router has (the twin has these and more: `simulator.fleet.policies`)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)


class RouterSpec(_Strict):
    """The router in front of the replicas: its policy and the settings sglang-router takes (the twin's
    policy of the same name reads them the same way)."""

    policy: str = "cache_aware"
    """random, round_robin, cache_aware, power_of_two, manual (sticky session keys); on the twin also
    least_outstanding and prefix_score, or any policy registered with `simulator.fleet.policies.register`."""
    url: Optional[str] = None
    """An existing router (not started or stopped by agentload); its policy is then what it runs."""
    cache_threshold: float = Field(0.3, ge=0, le=1)
    """cache_aware: the least prefix-match share of a request that sends it to the replica holding it."""
    balance_abs_threshold: int = Field(64, ge=0)
    """cache_aware: load difference (requests in flight) above which, with the relative one, it balances."""
    balance_rel_threshold: float = Field(1.5, ge=1)
    """cache_aware: ratio of most to least loaded above which, with the absolute one, it balances."""
    below_threshold: Literal["least_load", "smallest_tree"] = "least_load"
    """cache_aware, on the twin: where a request whose match is at or below `cache_threshold` goes. The
    router's documentation says the replica whose tree is smallest; sglang-router 0.3 as installed sends
    it to the replica with the fewest requests in flight (the first on a tie), which is the default."""
    eviction_interval: float = Field(60.0, gt=0)
    """cache_aware: seconds between two evictions of its approximate trees."""
    max_tree_size: int = Field(2 ** 26, gt=0)
    """cache_aware: most entries (characters live, tokens on the twin) a replica's tree keeps after an eviction."""
    assignment_mode: Literal["random", "min_load", "min_group"] = "random"
    """manual: where a new session key goes (sglang-router's --assignment-mode)."""
    load_penalty: float = Field(1.0, ge=0)
    """prefix_score (twin): prefix blocks one request in flight is worth (hit blocks minus this times load)."""
    args: list[str] = []
    """More flags for sglang-router."""
    startup_timeout: float = Field(60.0, gt=0)
    """Seconds the launched router has to answer its health check."""


class SessionSpec(_Strict):
    """How a call tells the router which session it belongs to."""

    header: Optional[str] = ROUTING_KEY_HEADER
    """Header that carries the session key (None: no header)."""
    user_field: bool = False
    """Also put the key in the request body's OpenAI ``user`` field."""
    sub_agents: Literal["parent", "own"] = "parent"
    """A sub-agent's calls carry its top-level task's key (`parent`) or a key of their own (`own`)."""


class DisaggregationSpec(_Strict):
    """Prefill/decode disaggregation (the twin only): a call is prefilled on a replica of the prefill
    pool, its KV cache moves over a link to a replica of the decode pool, which decodes it. Assumed:
    the whole prompt's KV moves, `kv_bytes_per_token` bytes a token at `link_gbps`, one transfer not
    slowing another (`simulator.fleet.twin`)."""

    prefill: int = Field(ge=1, le=4096)
    """Replicas in the prefill pool (r0 ... r{prefill-1})."""
    decode: int = Field(ge=1, le=4096)
    """Replicas in the decode pool (the ones after the prefill pool)."""
    kv_bytes_per_token: float = Field(gt=0)
    """Bytes of KV cache a prompt token takes (all layers), e.g. 2 x layers x KV heads x head size x 2
    bytes for bf16."""
    link_gbps: float = Field(gt=0)
    """Bandwidth of the link between a prefill and a decode replica, gigabits per second."""
    decode_policy: Optional[str] = None
    """The router's policy over the decode pool (default: `router.policy`, as sglang-router's PD mode)."""


class FleetSpec(_Strict):
    """Replicas behind a router. The replicas are launched (`emulator`, `vllm` or `server`, `replicas`
    of them) or given (`urls`); `profile` is the twin of each one for `agentload simulate` (default:
    the emulator's profile)."""

    replicas: int = Field(2, ge=1, le=4096)
    """How many replicas to launch, or to simulate (`urls` given: their count)."""
    emulator: Optional[dict[str, Any]] = None
    """Each replica is the built-in emulator with these settings (`simulator.emulator.settings`)."""
    vllm: Optional[VLLMCommand] = None
    """Each replica is a vLLM server of the CPU build."""
    server: Optional[ServerCommand] = None
    """Each replica runs this command (``{host}``, ``{port}`` filled in)."""
    urls: Optional[list[str]] = None
    """Existing replicas (not started or stopped by agentload), scraped at their /metrics."""
    profile: Optional[str] = None
    """Server profile of each replica on the twin (preset name or YAML file)."""
    router: RouterSpec = Field(default_factory=RouterSpec)
    session: SessionSpec = Field(default_factory=SessionSpec)
    startup_timeout: float = Field(300.0, gt=0)
    """Seconds each launched replica has to answer its health check."""
    disaggregation: Optional[DisaggregationSpec] = None
    """Prefill and decode pools instead of replicas that do both (the twin only); `replicas` is then
    their sum."""

    @model_validator(mode="after")
    def _one_kind(self) -> "FleetSpec":
        kinds = [k for k in ("emulator", "vllm", "server", "urls") if getattr(self, k) is not None]
        if len(kinds) > 1:
            raise ValueError(f"a fleet's replicas are one of emulator, vllm, server or urls, not {' and '.join(kinds)}")
        if self.urls is not None:
            if not self.urls:
                raise ValueError("`urls` lists no replica")
            self.replicas = len(self.urls)
        pd = self.disaggregation
        if pd is not None:
            if "replicas" in self.model_fields_set and self.replicas != pd.prefill + pd.decode:
                raise ValueError(f"`replicas` ({self.replicas}) is not the prefill and decode pools' sum "
                                 f"({pd.prefill} + {pd.decode}): leave it out")
            self.replicas = pd.prefill + pd.decode
        return self

    @property
    def kind(self) -> Optional[str]:
        """What the replicas are: 'emulator', 'vllm', 'server', 'urls', or None (only a twin fleet)."""
        return next((k for k in ("emulator", "vllm", "server", "urls") if getattr(self, k) is not None), None)

    def twin_profile(self) -> Optional[str]:
        """The profile each replica's twin runs: `profile`, else the emulator's."""
        if self.profile is not None:
            return self.profile
        return (self.emulator or {}).get("profile")

    def replica_names(self) -> list[str]:
        """The replicas' names: r0, r1, ..."""
        return [f"r{i}" for i in range(self.replicas)]
