"""A study's configs resolved: the base as given, each variant as the base plus what it changes, and
what each one is on the twin.

A variant that names no kind of its own changes the base: its `args` go after the base's server flags,
its `env` over the base's environment, its `emulator` settings over the base's, its `overlay` over the
base's profile overlay. One that names a kind (`server`, `vllm`, `url`, `profile`) runs that instead
(its `args`, `env` and `overlay` still apply). `differs_by` says in words what a variant changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

from ..errors import InputError
from ..sim.profile import ServerProfile, load_profile, merge
from .schema import ConfigEntry, ServerCommand, StudySpec, VLLMCommand

LIVE_KINDS = ("server", "vllm", "url", "emulator")
"""Kinds that send HTTP requests to a server (the rest, `twin`, simulate)."""


@dataclass(frozen=True)
class Config:
    """One config as the study runs it."""

    name: str
    kind: str
    """'server', 'vllm', 'url', 'emulator' or 'twin'."""
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

    @property
    def live(self) -> bool:
        """True when the config sends HTTP requests to a server."""
        return self.kind in LIVE_KINDS

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
        return [base] + [_variant(base, v, base_dir) for v in spec.configs.variants]
    except InputError as exc:
        exc.file = exc.file or spec.source
        raise


def _own(entry: ConfigEntry, base_dir: Path, is_base: bool = False) -> Config:
    """A config from an entry that names its kind."""
    kind = entry.kinds()[0]
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
    """`config` with the entry's flags and environment added to its server command."""
    if not entry.args and not entry.env:
        return config
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
