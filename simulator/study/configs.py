"""A study's configs resolved: the base as given, each variant as the base plus what it changes, and
what each one is on the twin.

A variant that names no kind of its own changes the base: its `args` go after the base's server flags,
its `env` over the base's environment, its `emulator` settings over the base's, its `overlay` over the
base's profile overlay. One that names a kind (`server`, `vllm`, `url`, `profile`) runs that instead
(its `args`, `env` and `overlay` still apply). A variant's `fleet` is merged over the base's fleet
(`simulator.study.fleets`). `differs_by` says in words what a variant changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

from ..errors import InputError
from ..sim.profile import ServerProfile, load_profile, merge
from . import fleets
from .schema import ConfigEntry, FleetSpec, ServerCommand, StudySpec, VLLMCommand

LIVE_KINDS = ("server", "vllm", "url", "emulator")
"""Kinds that send HTTP requests to a server (the rest, `twin`, simulate)."""


@dataclass(frozen=True)
class Config:
    """One config as the study runs it."""

    name: str
    kind: str
    """'server', 'vllm', 'url', 'emulator', 'twin' or 'fleet'."""
    is_base: bool = False
    differs_by: str = "base"
    server: Optional[ServerCommand] = None
    vllm: Optional[VLLMCommand] = None
    url: Optional[str] = None
    emulator: Optional[dict[str, Any]] = None
    profile: Optional[str] = None
    """The twin profile (preset name or resolved path): the config's own for a twin config."""
    overlay: dict[str, Any] = field(default_factory=dict)
    """Profile settings over `profile` (or over the study's twin profile, for a live config)."""
    has_twin_change: bool = False
    """True when the config says what it is on the twin: the base, or a variant with a profile or
    an overlay (a live variant that only changes flags has no twin equivalent)."""
    model: Optional[str] = None
    fleet: Optional[FleetSpec] = None
    """A fleet config's replicas and router (its `profile` is the replicas' twin profile)."""

    @property
    def live(self) -> bool:
        """True when the config sends HTTP requests to a server (or to a fleet's router)."""
        return self.kind in LIVE_KINDS or (self.fleet is not None and self.fleet.kind is not None)

    @property
    def replicas(self) -> int:
        """Servers the config runs: a fleet's replicas, else 1."""
        return self.fleet.replicas if self.fleet is not None else 1

    def on_twin(self, default: Optional[str]) -> Config:
        """The config on the twin: its profile (else `default`) plus its overlay; a fleet stays a fleet
        of as many replica twins behind the twin's model of its router."""
        profile = self.profile or default
        if self.fleet is not None:
            fleet = self.fleet.model_copy(update={"emulator": None, "vllm": None, "server": None, "urls": None,
                                                  "profile": profile,
                                                  "router": self.fleet.router.model_copy(update={"url": None})})
            return replace(self, fleet=fleet, profile=profile)
        return replace(self, kind="twin", profile=profile, server=None, vllm=None, url=None, emulator=None)

    @property
    def launched(self) -> bool:
        """True when agentload starts and stops the config's server."""
        return self.kind in ("server", "vllm")

    def twin_profile(self, default: Optional[str], where: str) -> ServerProfile:
        """The config on the twin: its profile (else `default`) with its overlay; InputError naming the
        study file when there is none or it does not load."""
        source = self.profile or default
        if source is None:
            raise InputError(f"config {self.name}: no twin profile (give `profile`, or twin.profile)", file=where,
                             path="twin.profile")
        try:
            profile = load_profile(source, self.overlay or None)
        except InputError as exc:
            raise InputError(f"config {self.name}: profile {source}: {exc}", file=where, path="configs") from None
        return profile.model_copy(update={"name": f"{profile.name}+{self.name}" if self.overlay else profile.name})


def resolve(spec: StudySpec) -> list[Config]:
    """The study's configs: the base, then each variant resolved against it."""
    base_dir = spec.base_dir()
    try:
        base = _own(spec.configs.base, base_dir, is_base=True)
        configs = [base] + [_fleet_variant(base, v, i, spec) if v.fleet is not None else _variant(base, v, base_dir)
                            for i, v in enumerate(spec.configs.variants)]
    except InputError as exc:
        exc.file = exc.file or spec.source
        raise
    _check_fleets(spec, configs)
    return configs


def _fleet_variant(base: Config, entry: ConfigEntry, index: int, spec: StudySpec) -> Config:
    """A variant with a `fleet`: merged over the base's fleet, or a fleet of the base's server."""
    assert entry.fleet is not None
    at = ["configs", "variants", index, "fleet"]
    change = fleets.given(entry.fleet)
    if base.fleet is not None:
        data = fleets.merged(fleets.given(base.fleet), change)
    else:
        fields = {"profile": base.profile, "emulator": base.emulator,
                  "vllm": base.vllm.model_dump(exclude_unset=True) if base.vllm else None,
                  "server": base.server.model_dump(exclude_unset=True) if base.server else None}
        try:
            data = fleets.of_server(base.kind, fields, change, entry.name)
        except InputError as exc:
            exc.line, exc.path = spec.line(at), ".".join(map(str, at))
            raise
    fleet = fleets.with_paths(fleets.validated(data, at, spec.line, spec.source, entry.name), spec.base_dir(),
                              resolve_profile, _path)
    config = Config(name=entry.name, kind="fleet", differs_by=_describe(entry), profile=fleet.twin_profile(),
                    overlay=merge(base.overlay, entry.overlay), has_twin_change=True, model=entry.model or base.model,
                    fleet=fleet)
    return _changed(config, entry)


def _check_fleets(spec: StudySpec, configs: list[Config]) -> None:
    """Each fleet's router policy known to what routes it; a study feature that asks one server of a
    fleet base refused."""
    base_entry = spec.configs.base
    for i, (config, entry) in enumerate(zip(configs, spec.config_entries())):
        if config.fleet is None:
            continue
        own = ["configs", "base", "fleet"] if i == 0 else ["configs", "variants", i - 1, "fleet"]
        at = fleets.policy_key([(own, entry.fleet), (["configs", "base", "fleet"], base_entry.fleet)])
        fleets.check_policy(config.fleet, config.live, config.name, own, at, spec.line, spec.source)
    base = configs[0]
    if base.fleet is not None and spec.space is not None:
        raise InputError("a config space searches one server's settings: its base cannot be a fleet",
                         file=spec.source, line=spec.line(["space"]), path="space")
    if base.fleet is not None and spec.twin is not None and spec.twin.calibrate:
        raise InputError("twin.calibrate calibrates one server, and a fleet's base config has none: calibrate a "
                         "replica with `agentload calibrate` and give its profile as fleet.profile", file=spec.source,
                         line=spec.line(["twin", "calibrate"]), path="twin.calibrate")


def _own(entry: ConfigEntry, base_dir: Path, is_base: bool = False) -> Config:
    """A config from an entry that names its kind."""
    kind = entry.kinds()[0]
    if kind == "fleet":
        assert entry.fleet is not None
        fleet = fleets.with_paths(entry.fleet, base_dir, resolve_profile, _path)
        return _changed(Config(name=entry.name, kind="fleet", is_base=is_base, profile=fleet.twin_profile(),
                               overlay=dict(entry.overlay), has_twin_change=True, model=entry.model, fleet=fleet),
                        entry)
    server = entry.server
    if server is not None and server.cwd is not None:
        server = server.model_copy(update={"cwd": str(_path(base_dir, server.cwd))})
    vllm = entry.vllm
    if vllm is not None:
        vllm = vllm.model_copy(update={"model": str(_path(base_dir, vllm.model))})
    config = Config(name=entry.name, kind="twin" if kind == "profile" else kind, is_base=is_base, server=server,
                    vllm=vllm, url=entry.url, emulator=dict(entry.emulator) if entry.emulator is not None else None,
                    profile=resolve_profile(entry.profile, base_dir), overlay=dict(entry.overlay),
                    has_twin_change=is_base or entry.profile is not None or bool(entry.overlay), model=entry.model)
    return _changed(config, entry)


def _variant(base: Config, entry: ConfigEntry, base_dir: Path) -> Config:
    """A variant: its own kind with its changes, or the base with its changes."""
    words = _describe(entry)
    if entry.kinds() and entry.kinds() != ["emulator"]:
        own = _own(entry, base_dir)
        overlay = merge(base.overlay, entry.overlay) if own.kind == "twin" and entry.profile is None else own.overlay
        return replace(own, overlay=overlay, differs_by=words)
    if entry.emulator is not None and base.kind != "emulator":
        raise InputError(f"variant {entry.name} changes emulator settings but the base is not the emulator",
                         path="configs.variants", field="emulator")
    if base.kind == "url" and (entry.args or entry.env):
        raise InputError(f"variant {entry.name}: a url config has no command to change; give its own `url`",
                         path="configs.variants", field="args")
    config = replace(base, name=entry.name, is_base=False, differs_by=words, overlay=merge(base.overlay, entry.overlay),
                     has_twin_change=bool(entry.overlay), model=entry.model or base.model)
    if base.emulator is not None and entry.emulator is not None:
        config = replace(config, emulator={**base.emulator, **entry.emulator}, has_twin_change=True)
    if base.kind == "twin":
        config = replace(config, has_twin_change=True)
    return _changed(config, entry)


def _changed(config: Config, entry: ConfigEntry) -> Config:
    """`config` with the entry's flags and environment added to its server command (a fleet's: to each
    replica's)."""
    if not entry.args and not entry.env:
        return config
    if config.fleet is not None and (config.fleet.server is not None or config.fleet.vllm is not None):
        inner = _changed(replace(config, fleet=None, server=config.fleet.server, vllm=config.fleet.vllm), entry)
        return replace(config, fleet=config.fleet.model_copy(update={"server": inner.server, "vllm": inner.vllm}))
    if config.server is not None:
        server = config.server.model_copy(update={"argv": [*config.server.argv, *entry.args],
                                                  "env": {**config.server.env, **entry.env}})
        return replace(config, server=server)
    if config.vllm is not None:
        vllm = config.vllm.model_copy(update={"args": [*config.vllm.args, *entry.args],
                                              "env": {**config.vllm.env, **entry.env}})
        return replace(config, vllm=vllm)
    raise InputError(f"config {entry.name}: `args` and `env` need a server or vllm config to change",
                     path="configs", field="args")


def _describe(entry: ConfigEntry) -> str:
    """What a variant changes, in words."""
    parts = []
    for kind in entry.kinds():
        value = getattr(entry, kind)
        if kind == "emulator":
            parts.append(" ".join(f"emulator.{k}={v}" for k, v in value.items()))
        elif kind == "fleet":
            parts.append(" ".join(fleets.words(value)) or "the base's fleet")
        elif kind in ("url", "profile"):
            parts.append(f"{kind} {value}")
        else:
            parts.append(f"own {kind} command")
    if entry.args:
        parts.append(" ".join(entry.args))
    parts += [f"{k}={v}" for k, v in entry.env.items()]
    parts += [f"{k}={v}" for k, v in flatten(entry.overlay).items()]
    return "; ".join(parts) if parts else "nothing (a repeat of the base)"


def flatten(mapping: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as dotted keys: {scheduler: {max_num_seqs: 4}} -> {scheduler.max_num_seqs: 4}."""
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def resolve_profile(name: Optional[str], base_dir: Path) -> Optional[str]:
    """A profile YAML path made absolute against the study's folder; a preset name as it is."""
    if name is None:
        return None
    if name.endswith((".yaml", ".yml")):
        return str(_path(base_dir, name))
    return name


def _path(base_dir: Path, path: str) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else (base_dir / p).resolve()
