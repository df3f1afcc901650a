"""A config space: profile settings, each combination a twin config (every one of a grid, or those a
search proposes: `simulator.study.search`); the best few become live configs, the base's server with the
flags that `space.args` maps each setting to."""

from __future__ import annotations

import itertools
import shlex
from dataclasses import dataclass, replace
from typing import Any

from ..errors import InputError
from ..sim.profile import merge
from .configs import Config
from .schema import SpaceSpec


@dataclass(frozen=True)
class Candidate:
    """One combination of the grid."""

    name: str
    settings: dict[str, Any]
    """Dotted key: value."""

    def overlay(self) -> dict[str, Any]:
        """The settings shaped like a profile file."""
        out: dict[str, Any] = {}
        for key, value in self.settings.items():
            section, name = key.split(".", 1)
            out.setdefault(section, {})[name] = value
        return out


def candidates(space: SpaceSpec) -> list[Candidate]:
    """Every combination of the grid, in the grid's order."""
    assert space.grid is not None
    keys = list(space.grid)
    return [candidate_of(dict(zip(keys, values))) for values in itertools.product(*(space.grid[k] for k in keys))]


def candidate_of(settings: dict[str, Any]) -> Candidate:
    """The candidate of these settings, named after them: the same settings, the same name (and so the
    same folders in the study, whichever method proposed them)."""
    name = "space-" + ".".join(f"{k.split('.', 1)[1]}-{_text(v)}" for k, v in settings.items())
    return Candidate(name, dict(settings))


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value).replace("/", "_").replace(" ", "_")


def twin_config(candidate: Candidate, base: Config, profile: str) -> Config:
    """The candidate on the twin: `profile` with the base's overlay and the candidate's settings."""
    return Config(name=candidate.name, kind="twin", profile=profile, overlay=merge(base.overlay, candidate.overlay()),
                  differs_by=", ".join(f"{k}={_text(v)}" for k, v in candidate.settings.items()), has_twin_change=True)


def server_args(candidate: Candidate, space: SpaceSpec, where: str) -> list[str]:
    """The flags the candidate adds to the base's server command (none: it is the base's server, as when
    `space.args` maps each of its values to no flag, the server's own default)."""
    args: list[str] = []
    for key, value in candidate.settings.items():
        args += flags(space, key, value, where)
    return args


def live_config(candidate: Candidate, base: Config, space: SpaceSpec, where: str) -> Config:
    """The candidate live: the base's server with each setting's flags after the base's own."""
    args = server_args(candidate, space, where)
    config = replace(base, name=candidate.name, is_base=False, differs_by=" ".join(args) or "nothing",
                     overlay=merge(base.overlay, candidate.overlay()), has_twin_change=True)
    if base.server is not None:
        return replace(config, server=base.server.model_copy(update={"argv": [*base.server.argv, *args]}))
    if base.vllm is not None:
        return replace(config, vllm=base.vllm.model_copy(update={"args": [*base.vllm.args, *args]}))
    raise InputError("a config space runs live only on a launched base (server or vllm)", file=where, path="space")


def flags(space: SpaceSpec, key: str, value: Any, where: str) -> list[str]:
    """The server flags of one setting: ``"--flag {value}"`` formatted, or a mapping's entry for the value."""
    rule = space.args.get(key)
    if rule is None:
        raise InputError(f"no server flag for {key}: say how it is passed in space.args", file=where,
                         path=f"space.args.{key}")
    if isinstance(rule, dict):
        picked = rule.get(value, rule.get(_text(value)))
        if picked is None:
            raise InputError(f"space.args.{key} has no entry for {_text(value)}", file=where, path=f"space.args.{key}")
        return shlex.split(str(picked))
    return shlex.split(str(rule).replace("{value}", _text(value) if isinstance(value, bool) else str(value)))
