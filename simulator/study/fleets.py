"""A study's fleet configs resolved: a base's `fleet` with its paths made absolute, a variant's `fleet`
merged key by key over the base's (or, over a base that is no fleet, a fleet of the base's server),
and the router policy checked against what runs it (the twin's policies, or sglang-router's).

Errors name the study file's line and the key (`InputError` with `line`, `path` and `field`): a
merged fleet is validated here, after the file's own validation, so its problems are placed at the
variant's `fleet` key, and a policy is looked up where it runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from pydantic import ValidationError

from ..errors import InputError
from ..scenario.fleet import LIVE_POLICIES, FleetSpec
from ..sim.profile import merge
from ..validation import closest

REPLICA_KINDS = ("emulator", "vllm", "server", "urls")
"""What a fleet's replicas can be live (none of them: a fleet on the twin)."""
Line = Callable[[Sequence[Any]], Optional[int]]
"""The study file's line of a key path (`simulator.study.schema.StudySpec.line`)."""


def with_paths(fleet: FleetSpec, base_dir: Path, resolve_profile: Callable[[Optional[str], Path], Optional[str]],
               path: Callable[[Path, str], Path]) -> FleetSpec:
    """`fleet` with its relative paths (profile, the emulator's profile, vLLM model folder, server
    folder) made absolute against the study's folder."""
    update: dict[str, Any] = {}
    if fleet.profile is not None:
        update["profile"] = resolve_profile(fleet.profile, base_dir)
    if fleet.emulator is not None and isinstance(fleet.emulator.get("profile"), str):
        update["emulator"] = {**fleet.emulator, "profile": resolve_profile(fleet.emulator["profile"], base_dir)}
    if fleet.vllm is not None:
        update["vllm"] = fleet.vllm.model_copy(update={"model": str(path(base_dir, fleet.vllm.model))})
    if fleet.server is not None and fleet.server.cwd is not None:
        update["server"] = fleet.server.model_copy(update={"cwd": str(path(base_dir, fleet.server.cwd))})
    return fleet.model_copy(update=update) if update else fleet


def given(fleet: FleetSpec) -> dict[str, Any]:
    """The keys a fleet section gave (nested sections: their given keys), as a mapping to merge; the
    replica count left out where the URLs or the prefill and decode pools make it."""
    out = fleet.model_dump(exclude_unset=True)
    if fleet.urls is not None or fleet.disaggregation is not None:
        out.pop("replicas", None)
    return out


def merged(base: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    """`change` over `base`, key by key; a change that names other replicas (another of emulator, vllm,
    server, urls) drops the base's."""
    kinds = {k for k in REPLICA_KINDS if change.get(k) is not None}
    if kinds and kinds != {k for k in REPLICA_KINDS if base.get(k) is not None}:
        base = {k: v for k, v in base.items() if k not in REPLICA_KINDS}
    return merge(base, change)


def of_server(base_kind: str, base_fields: dict[str, Any], change: dict[str, Any], name: str) -> dict[str, Any]:
    """A variant's fleet over a base that is no fleet: its replicas are the base's server (its profile,
    emulator settings, vLLM or server command) unless the variant names its own."""
    if any(change.get(k) is not None for k in (*REPLICA_KINDS, "profile")):
        return change
    if base_kind == "url":
        raise InputError(f"variant {name}: a fleet of one existing server makes no sense: give the replicas' "
                         "URLs as fleet.urls", field="fleet")
    key = "profile" if base_kind == "twin" else base_kind
    return {**change, key: base_fields[key]}


def validated(data: dict[str, Any], at: list[Any], line: Line, source: str, name: str) -> FleetSpec:
    """`data` as a FleetSpec; a problem named at the key `at` (+ the problem's own place in the fleet)
    with its line in the study file."""
    try:
        return FleetSpec.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        loc = [*at, *error["loc"]]
        message = error["msg"].removeprefix("Value error, ")
        raise InputError(f"config {name}: fleet: {message}", file=source, line=line(loc),
                         path=".".join(map(str, loc)), field=str(loc[-1])) from None


def twin_policies() -> list[str]:
    """The router policies the twin has (`simulator.fleet.policies`: its own and those registered)."""
    from ..fleet import policies  # noqa: PLC0415 - the twin's router models, only when a fleet is checked

    return sorted(policies.POLICIES)


def check_policy(fleet: FleetSpec, live: bool, name: str, fleet_at: list[Any], policy_at: list[Any], line: Line,
                 source: str) -> None:
    """An InputError when the router that runs the fleet has no such policy (named at `policy_at`, the
    key that set it): sglang-router's for a live fleet (unless it is an existing router, whose policy is
    its own), the twin's otherwise; also when a live fleet asks for prefill/decode disaggregation, or
    the decode pool's policy is unknown (named under `fleet_at`, the config's fleet)."""
    pd = fleet.disaggregation
    if live and pd is not None:
        raise InputError(f"config {name}: prefill/decode disaggregation is modelled on the twin only: run this "
                         "config on the twin (`--twin`, or a fleet of `profile` only)", file=source,
                         line=line([*fleet_at, "disaggregation"]), path=".".join(map(str, [*fleet_at, "disaggregation"])),
                         field="disaggregation")
    if pd is not None and pd.decode_policy is not None and pd.decode_policy not in twin_policies():
        at = [*fleet_at, "disaggregation", "decode_policy"]
        raise InputError(f"config {name}: the twin has no router policy {pd.decode_policy!r} for the decode pool; "
                         f"known: {', '.join(twin_policies())}", file=source, line=line(at),
                         path=".".join(map(str, at)), field="decode_policy")
    policy = fleet.router.policy
    if live and fleet.router.url is not None:
        return
    known = list(LIVE_POLICIES) if live else twin_policies()
    if policy in known:
        return
    where = "sglang-router" if live else "the twin"
    hint = closest(policy, known)
    extra = ""
    if live and policy in twin_policies():
        extra = " (it is the twin's alone: run this config on the twin, or pick a live policy)"
    elif hint:
        extra = f" (did you mean {hint}?)"
    raise InputError(f"config {name}: {where} has no router policy {policy!r}{extra}; known: {', '.join(known)}",
                     file=source, line=line(policy_at), path=".".join(map(str, policy_at)), field="policy")


def policy_key(entries: Sequence[tuple[list[Any], Optional[FleetSpec]]]) -> list[Any]:
    """The key path that set a config's router policy: the first of `entries` (the config's own fleet,
    then the base's) whose fleet names one, else the first fleet's `router` (the default policy)."""
    for at, fleet in entries:
        if fleet is not None and "router" in fleet.model_fields_set and "policy" in fleet.router.model_fields_set:
            return [*at, "router", "policy"]
    return [*entries[0][0], "router"]


def words(fleet: FleetSpec) -> list[str]:
    """What a variant's fleet changes, as dotted settings: fleet.replicas=4, fleet.router.policy=manual."""
    return [f"fleet.{k}={v}" for k, v in _flatten(given(fleet)).items()]


def _flatten(mapping: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, dict) and value:
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def router_label(fleet: FleetSpec) -> str:
    """The router in a few words: its policy, and the settings it has off their defaults (two fleets of
    the same label route alike), e.g. 'cache_aware cache_threshold=0.5'."""
    changed = {k: v for k, v in fleet.router.model_dump(exclude_defaults=True).items()
               if k not in ("policy", "url", "args", "startup_timeout")}
    session = fleet.session.model_dump(exclude_defaults=True)
    parts = [fleet.router.policy] + [f"{k}={v}" for k, v in changed.items()]
    parts += [f"session.{k}={v}" for k, v in session.items()]
    return " ".join(parts)
