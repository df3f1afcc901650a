"""`--set KEY=VALUE` overrides of a YAML file's mapping (a scenario's, a study's): the key a dotted path
into the mapping, the value parsed as YAML."""

from __future__ import annotations

from typing import Sequence

import yaml

from ..errors import InputError
from ..metrics.slo import PERCENTILE_KEYS
from .yaml_io import MAX_NESTING, too_deep

_DOTTED_KEYS = frozenset(k for k in PERCENTILE_KEYS if "." in k)
"""Setting names with a dot in them (``p99.9``), kept whole when --set splits its key path."""


def apply(data: dict, items: Sequence[str], source: str) -> set[str]:
    """Set each ``key.path=value`` of `items` in `data` (sections made as needed); returns the keys set.
    `source` names the file in errors."""
    return {_apply_one(data, item, source) for item in items}


def _apply_one(data: dict, item: str, source: str) -> str:
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise InputError(f"--set expects key.path=value, got {item!r}", file=source)
    if too_deep(raw):
        raise InputError(f"--set {key}: value nested more than {MAX_NESTING} levels deep", file=source)
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    except RecursionError:
        raise InputError(f"--set {key}: value nested too deeply", file=source) from None
    parts = key_parts(key)
    here = data
    for i, part in enumerate(parts[:-1]):
        nxt = here.get(part)
        if nxt is None:
            nxt = here[part] = {}
        if not isinstance(nxt, dict):
            raise InputError(f"--set {key}: {'.'.join(parts[:i + 1])} is not a mapping", file=source)
        here = nxt
    here[parts[-1]] = value
    return key


def key_parts(key: str) -> list[str]:
    """The parts of a --set key path: split at dots, except inside a name that has one (``slo.ttft_ms.p99.9``)."""
    parts = key.split(".")
    out: list[str] = []
    i = 0
    while i < len(parts):
        if i + 1 < len(parts) and f"{parts[i]}.{parts[i + 1]}" in _DOTTED_KEYS:
            out.append(f"{parts[i]}.{parts[i + 1]}")
            i += 2
        else:
            out.append(parts[i])
            i += 1
    return out
