"""Pydantic validation errors made readable: every problem of a file at once, each at its YAML path, with
"did you mean" for a misspelt key or choice.

`problems(exc, model)` turns a `ValidationError` of `model` into `Problem`s; the loaders (scenario, study,
workload model, server profile) place each in their file (line, path) and raise them together as one
`InputError`. Validators that check names themselves raise `unknown_keys` or `bad_choice`, so that
their problems get the same treatment.
"""

from __future__ import annotations

import collections.abc
import difflib
import enum
import functools
import json
import reprlib
import types
from dataclasses import dataclass
from typing import Annotated, Any, Iterable, Literal, Optional, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic_core import PydanticCustomError

UNKNOWN_KEYS = "unknown_keys"
"""Error type of `unknown_keys`: ctx holds `keys` (the unknown names) and `known`."""
BAD_CHOICE = "bad_choice"
"""Error type of `bad_choice`: ctx holds `choices`."""


def unknown_keys(keys: Iterable[str], known: Iterable[str], what: str = "setting") -> PydanticCustomError:
    """The error a validator raises for names a mapping may not hold (one problem per name)."""
    keys, known = sorted(map(str, keys)), sorted(map(str, known))
    return PydanticCustomError(UNKNOWN_KEYS, "unknown {what}(s) {names} (known: {known_text})",
                               {"what": what, "keys": keys, "known": known, "names": ", ".join(keys),
                                "known_text": ", ".join(known)})


def bad_choice(value: Any, choices: Iterable[str], what: str) -> PydanticCustomError:
    """The error a validator raises for a value that is none of `choices` (a name looked up at run time)."""
    choices = list(choices)
    return PydanticCustomError(BAD_CHOICE, "unknown {what} {value} (known: {known_text})",
                               {"what": what, "value": shown(value), "choices": choices,
                                "known_text": ", ".join(choices)})


def closest(word: Any, choices: Iterable[Any]) -> Optional[str]:
    """The choice `word` is most likely a misspelling of, or None when none is close."""
    if not isinstance(word, str):
        return None
    options = [str(c) for c in choices]
    folded = {o.lower(): o for o in options}
    if word.lower() in folded and folded[word.lower()] != word:
        return folded[word.lower()]  # the same name in another case
    found = difflib.get_close_matches(word, options, n=1, cutoff=0.6)
    return found[0] if found else None


def shown(value: Any) -> str:
    """A bad value for an error message, cut short (a YAML alias can make a huge structure)."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        text = json.dumps(value, default=str)
    else:
        text = reprlib.repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass(frozen=True)
class Problem:
    """One validation problem: where (`loc`, the path of keys and list indexes, union tags left out),
    what (`message`), and for a misspelt key or value the closest allowed one (`suggestion`).
    `known` lists the keys allowed where an unknown key sits (to name when none is close)."""

    loc: tuple
    message: str
    suggestion: Optional[str] = None
    is_key: bool = False
    known: tuple[str, ...] = ()

    @property
    def dotted(self) -> str:
        """The path as ``a.b.0.c``."""
        return ".".join(str(p) for p in self.loc)

    @property
    def field(self) -> Optional[str]:
        """The last key of the path."""
        return next((str(p) for p in reversed(self.loc) if isinstance(p, str)), None)

    def text(self, suggestion: Optional[str] = None) -> str:
        """The message with its hint; `suggestion` replaces the bare suggestion (e.g. by a --set key path)."""
        hint = suggestion or self.suggestion
        if hint is not None:
            return f"{self.message}; did you mean `{hint}`?"
        if self.is_key and self.known and len(self.known) <= 40:
            return f"{self.message} (known here: {', '.join(self.known)})"
        return self.message


def problems(exc: ValidationError, model: Optional[type[BaseModel]] = None) -> list[Problem]:
    """Every problem of `exc` (a validation of `model`), in pydantic's order. A value that matches no
    member of a union gets errors from each member: only those of the member whose error went deepest
    (the one the value was most likely meant as) are kept."""
    walked = [_Walked(error, *_walk(model, tuple(error["loc"]), error["type"])) for error in exc.errors()]
    out: list[Problem] = []
    for item in _one_union_member(walked):
        out.extend(_problems_of(item))
    return out


@dataclass
class _Walked:
    """A pydantic error with its location read against the model."""

    error: dict
    loc: tuple
    """The location with union tags left out."""
    kinds: list
    """The types the value at the location may have (empty: not known)."""
    first_tag: Optional[int]
    """Index in the raw location of its first union tag (None: the error is outside any union)."""
    parent_keys: tuple[str, ...]
    """The keys allowed in the mapping that holds the value."""


# --- union members -------------------------------------------------------------------------------


def _one_union_member(walked: list[_Walked]) -> list[_Walked]:
    """The errors with those of all but one member of each failed union left out."""
    keep: dict[int, bool] = {}
    groups: dict[tuple, list[int]] = {}
    for i, item in enumerate(walked):
        if item.first_tag is None:
            keep[i] = True
        else:
            groups.setdefault(tuple(item.error["loc"][:item.first_tag]), []).append(i)
    for prefix, members in groups.items():
        deepest = max(members, key=lambda i: (len(walked[i].error["loc"]), -i))
        tag = walked[deepest].error["loc"][len(prefix)]
        for i in members:
            keep[i] = walked[i].error["loc"][len(prefix)] == tag
    return [walked[i] for i in sorted(keep) if keep[i]]


_SCALAR_TAGS = frozenset({"str", "int", "float", "bool", "none", "bytes", "dict", "list"})
"""How pydantic names the members of a union that are plain types."""


# --- one error -----------------------------------------------------------------------------------


def _problems_of(item: _Walked) -> list[Problem]:
    error, loc = item.error, item.loc
    raw = tuple(error["loc"])
    kind = error["type"]
    message = error["msg"].removeprefix("Value error, ")
    ctx = error.get("ctx") or {}
    if kind == UNKNOWN_KEYS:
        known = tuple(ctx.get("known", ()))
        return [Problem(loc + (key,), f"unknown {ctx.get('what', 'setting')}", closest(key, known), True, known)
                for key in ctx.get("keys", ())]
    if kind == BAD_CHOICE:
        return [Problem(loc, message, closest(error.get("input"), ctx.get("choices", ())))]
    if kind == "extra_forbidden":
        return [Problem(loc, "unknown key", closest(raw[-1], item.parent_keys), True, item.parent_keys)]
    if kind == "missing":
        return [Problem(loc, "required key missing")]
    value = error.get("input")
    if kind not in ("value_error", "assertion_error") and not isinstance(value, dict):
        message += f" (got {shown(value)})"
    suggestion = None
    if kind in ("literal_error", "enum"):
        suggestion = closest(value, _choices_of(item.kinds))
    elif kind == "union_tag_invalid":  # a discriminated union's tag (`kind: lognormall`)
        suggestion = closest(ctx.get("tag"), sorted({str(v) for t in item.kinds for v in _literal_fields(t)}))
    return [Problem(loc, message, suggestion)]


def _walk(model: Optional[type[BaseModel]], raw: tuple, kind: str) -> tuple[tuple, list, Optional[int], tuple]:
    """(the location without union tags, the types the value at it may have, the index of the first
    union tag, the keys allowed in the mapping that holds the value)."""
    kinds = _arms(model) if model is not None else []
    loc: list = []
    first_tag: Optional[int] = None
    parent_keys: tuple[str, ...] = ()
    for i, part in enumerate(raw):
        if isinstance(part, str) and ("[" in part or part.startswith("function-")):
            is_tag = True
        elif not kinds or any(t is Any for t in kinds):
            is_tag = part in _SCALAR_TAGS  # below a value of any type, only plain type names are tags
        else:
            nxt = _step(kinds, part)
            unknown_key = i == len(raw) - 1 and kind == "extra_forbidden"
            if nxt or unknown_key:
                if unknown_key:
                    parent_keys = tuple(_keys_of(kinds))
                loc.append(part)
                kinds = nxt
                continue
            tagged = [t for t in kinds if _tag_of(t) == part or part in _literal_fields(t)]
            is_tag = bool(tagged) or part in _SCALAR_TAGS
        if is_tag:
            first_tag = i if first_tag is None else first_tag
            kinds = [t for t in kinds if _tag_of(t) == part or part in _literal_fields(t)] or kinds
        else:
            loc.append(part)
            kinds = []
    return tuple(loc), kinds, first_tag, parent_keys


def _arms(tp: Any) -> list:
    """The members of a type: Annotated and Optional unwrapped, Unions split."""
    try:
        return list(_arms_cached(tp))
    except TypeError:  # a type that cannot be a cache key
        return _arms_of(tp)


@functools.lru_cache(maxsize=1024)
def _arms_cached(tp: Any) -> tuple:
    return tuple(_arms_of(tp))


def _arms_of(tp: Any) -> list:
    origin = get_origin(tp)
    if origin is Annotated:
        return _arms_of(get_args(tp)[0])
    if origin is Union or origin is types.UnionType:
        return [arm for arg in get_args(tp) for arm in _arms_of(arg)]
    return [tp]


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, BaseModel)


@functools.lru_cache(maxsize=None)
def _fields(model: type[BaseModel]) -> dict[str, Any]:
    """A model's fields by every name that validates them (the field name and its alias)."""
    out: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        out[name] = info
        if isinstance(info.alias, str):
            out[info.alias] = info
    return out


def _step(kinds: list, part: Any) -> list:
    out: list = []
    for tp in kinds:
        if _is_model(tp):
            info = _fields(tp).get(part)
            if info is not None:
                out.extend(_arms(info.annotation))
            continue
        origin, args = get_origin(tp), get_args(tp)
        if origin in (list, tuple, set, frozenset, collections.abc.Sequence) and isinstance(part, int) and args:
            out.extend(_arms(args[0]))
        elif origin in (dict, collections.abc.Mapping) and len(args) == 2 and isinstance(part, str):
            out.extend(_arms(args[1]))
    return out


def _keys_of(kinds: list) -> list[str]:
    """The keys a mapping of one of these types may hold (aliases rather than names where both exist)."""
    keys: list[str] = []
    for tp in kinds:
        if _is_model(tp):
            for name, info in tp.model_fields.items():
                key = info.alias if isinstance(info.alias, str) else name
                if key not in keys:
                    keys.append(key)
    return keys


def _choices_of(kinds: list) -> list[str]:
    """The values a Literal or Enum among these types allows."""
    out: list[str] = []
    for tp in kinds:
        if get_origin(tp) is Literal:
            out.extend(str(v) for v in get_args(tp))
        elif isinstance(tp, type) and issubclass(tp, enum.Enum):
            out.extend(str(m.value) for m in tp)
    return out


def _tag_of(tp: Any) -> Optional[str]:
    return tp.__name__ if isinstance(tp, type) else None


def _literal_fields(tp: Any) -> frozenset:
    """The values of a model's single-valued Literal fields (how a discriminated union tags its members)."""
    return _model_literals(tp) if _is_model(tp) else frozenset()


@functools.lru_cache(maxsize=None)
def _model_literals(model: type[BaseModel]) -> frozenset:
    out = set()
    for info in model.model_fields.values():
        args = get_args(info.annotation) if get_origin(info.annotation) is Literal else ()
        if len(args) == 1:
            out.add(args[0])
    return frozenset(out)
