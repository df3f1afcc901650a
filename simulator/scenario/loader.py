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
    return _with_emulator_profile(scenario, node, source)


def _with_emulator_profile(scenario: Scenario, root: Any, source: str) -> Scenario:
    """`scenario` once `emulator.profile` is checked to load, a relative YAML path resolved against the
    scenario's folder."""
    name = scenario.emulator.profile
    if name is None:
        return scenario
    from ..sim.profile import load_profile  # noqa: PLC0415 - only scenarios that ask for a twin

    path = scenario.resolve(name)
    try:
        if path.suffix in (".yaml", ".yml") and path.is_file():
            name = str(path)
            scenario.emulator = scenario.emulator.model_copy(update={"profile": name})
        load_profile(name)
    except (InputError, OSError) as exc:  # OSError: e.g. a name too long for the file system
        found = exc.problems if isinstance(exc, InputError) else (InputError(exc.strerror or str(exc)),)
        line = line_of(root, ["emulator", "profile"])
        raise InputError.several([
            InputError(f"emulator profile: {f'at {p.path}: ' if p.path else ''}{p.message}", file=source, line=line,
                       path="emulator.profile", field="profile") for p in found]) from None
    return scenario
