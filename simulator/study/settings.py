"""The settings a config space varies: a dotted profile key (``scheduler.max_num_seqs``) names one field
of a section of the server profile (`simulator.sim.profile.ServerProfile`). This module says which keys
exist, whether a value is one the field takes, and whether a field is a whole or a real number (what a
range of it samples: `space.method: tpe`)."""

from __future__ import annotations

import functools
import types
from typing import Annotated, Any, Optional, Union, get_args, get_origin

from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from ..sim.profile import ServerProfile


def _unwrapped(annotation: Any) -> list[Any]:
    """The members of an annotation, Optional and Union split, None left out."""
    if get_origin(annotation) in (Union, types.UnionType):
        return [arm for arg in get_args(annotation) for arm in _unwrapped(arg)]
    return [] if annotation is type(None) else [annotation]


def _model(annotation: Any) -> Optional[type[BaseModel]]:
    """The section model an annotation holds (None: a plain field)."""
    for arm in _unwrapped(annotation):
        if isinstance(arm, type) and issubclass(arm, BaseModel):
            return arm
    return None


@functools.lru_cache(maxsize=None)
def _fields() -> dict[str, FieldInfo]:
    """Every plain field of every profile section, by its dotted key (nested sections such as
    kv_cache.hybrid, and the calibration's record, left out)."""
    out = {}
    for section, info in ServerProfile.model_fields.items():
        model = _model(info.annotation)
        if model is None or section == "calibration":
            continue
        for name, field in model.model_fields.items():
            if _model(field.annotation) is None:
                out[f"{section}.{name}"] = field
    return out


def known_keys() -> list[str]:
    """The dotted keys a config space may vary, sorted."""
    return sorted(_fields())


def is_known(key: str) -> bool:
    """Whether `key` names a profile field a space may vary."""
    return key in _fields()


@functools.lru_cache(maxsize=None)
def _adapter(key: str) -> TypeAdapter:
    field = _fields()[key]
    return TypeAdapter(Annotated[field.annotation, *field.metadata] if field.metadata else field.annotation)


def refusal(key: str, value: Any) -> Optional[str]:
    """Why the profile field `key` refuses `value` on its own (None: it takes it). Rules between fields
    (max_model_len against the KV pool) are the candidate's feasibility (`simulator.study.feasible`)."""
    try:
        _adapter(key).validate_python(value)
    except ValidationError as exc:
        return exc.errors()[0]["msg"]
    return None


def number_kind(key: str) -> Optional[str]:
    """'int' for a whole-number field, 'float' for a real one, None for any other (a flag, a name):
    what a range of the setting samples."""
    arms = _unwrapped(_fields()[key].annotation)
    if arms and all(arm is int for arm in arms):
        return "int"
    if arms and all(arm in (int, float) for arm in arms):
        return "float"
    return None
