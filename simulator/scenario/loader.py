"""Reading a scenario file: its YAML validated as a `Scenario`, `--set` overrides applied, and the
emulator's profile checked (a relative YAML path resolved against the scenario's folder)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from ..errors import InputError
from . import overrides as override
from .schema import Scenario
from .yaml_io import line_of, read_mapping, read_text, validate


def load(path: str | Path, overrides: Sequence[str] = ()) -> Scenario:
    """Read and validate a scenario file, applying ``key.path=value`` overrides (values parsed as YAML)."""
    path = Path(path)
    return parse(read_text(path, "scenario"), str(path), overrides)


def parse(text: str, source: str, overrides: Sequence[str] = ()) -> Scenario:
    """Validate scenario YAML text; `source` names it in errors and anchors relative paths."""
    data, node = read_mapping(text, source, "a scenario", "a scenario must be a mapping (workload, target, run, slo)")
    set_keys = override.apply(data, overrides, source)
    scenario = validate(Scenario, data, node, source, set_keys, "a scenario")
    if scenario.target is not None and scenario.target.base_url is None and scenario.fleet is None:
        raise InputError("Field required: the server to replay against (or a `fleet`)", file=source,
                         line=line_of(node, ["target", "base_url"]), path="target.base_url", field="base_url")
    scenario = _with_emulator_profile(scenario, node, source)
    return _with_fleet_profiles(scenario, node, source)


def _with_emulator_profile(scenario: Scenario, root: Any, source: str) -> Scenario:
    """`scenario` once `emulator.profile` is checked to load, a relative YAML path resolved against the
    scenario's folder."""
    name = scenario.emulator.profile
    if name is not None:
        scenario.emulator = scenario.emulator.model_copy(
            update={"profile": _checked_profile(scenario, name, root, source, ["emulator", "profile"])})
    return scenario


def _with_fleet_profiles(scenario: Scenario, root: Any, source: str) -> Scenario:
    """`scenario` once the fleet's profiles (its twin's, its emulator replicas') are checked to load,
    relative YAML paths resolved against the scenario's folder."""
    fleet = scenario.fleet
    if fleet is None:
        return scenario
    if fleet.profile is not None:
        fleet.profile = _checked_profile(scenario, fleet.profile, root, source, ["fleet", "profile"])
    if fleet.emulator is not None and isinstance(fleet.emulator.get("profile"), str):
        fleet.emulator = {**fleet.emulator, "profile": _checked_profile(
            scenario, fleet.emulator["profile"], root, source, ["fleet", "emulator", "profile"])}
    return scenario


def _checked_profile(scenario: Scenario, name: str, root: Any, source: str, loc: list[str]) -> str:
    """A profile setting at `loc` once checked to load: a relative YAML path made absolute against the
    scenario's folder, a preset name as given; InputError naming the setting's line otherwise."""
    from ..sim.profile import load_profile  # noqa: PLC0415 - only scenarios that ask for a twin

    path = scenario.resolve(name)
    try:
        if path.suffix in (".yaml", ".yml") and path.is_file():
            name = str(path)
        load_profile(name)
    except (InputError, OSError) as exc:  # OSError: e.g. a name too long for the file system
        found = exc.problems if isinstance(exc, InputError) else (InputError(exc.strerror or str(exc)),)
        where = " ".join(loc[:-1])
        raise InputError.several([
            InputError(f"{where} profile: {f'at {p.path}: ' if p.path else ''}{p.message}", file=source,
                       line=line_of(root, loc), path=".".join(loc), field="profile") for p in found]) from None
    return name
