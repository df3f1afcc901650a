"""YAML files validated by pydantic, with errors that name the file, the line and the YAML path: scenario
files and study files read through here alike.

`read_mapping` reads a file's text into its top-level mapping and the YAML node tree its lines come
from; `validate` checks that mapping against a `FileModel` and turns every problem into one `InputError`
(see `InputError.several`), each at its line, or said to come from `--set` (`overrides`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional, Self, TypeVar

import yaml
from pydantic import BaseModel, PrivateAttr, ValidationError

from .. import validation
from ..errors import InputError

MAX_NESTING = 64
"""Deepest nesting of brackets or braces a scenario's YAML may have (PyYAML slows to seconds, then fails,
on thousands)."""


class FileModel(BaseModel):
    """A model read from a file: it knows which (`source`), and relative paths in it resolve against
    that file's folder (`base_dir`)."""

    _source: Optional[str] = PrivateAttr(None)

    @property
    def source(self) -> Optional[str]:
        """The file the model was read from (None: made without one)."""
        return self._source

    def with_source(self, source: Optional[str]) -> Self:
        """A copy of the model that says it was read from `source` (None: from no file), for a model made
        in code that stands for a file's (its relative paths then resolve against that file's folder)."""
        out = self.model_copy()
        out._source = source
        return out

    def base_dir(self) -> Path:
        """The folder relative paths resolve against: the file's, else the current one."""
        return Path(self._source).resolve().parent if self._source else Path.cwd()

    def resolve(self, path: str) -> Path:
        """`path` (``~`` expanded) relative to `base_dir`, unless absolute."""
        p = Path(os.path.expanduser(path))
        return p if p.is_absolute() else self.base_dir() / p


Model = TypeVar("Model", bound=FileModel)


def read_text(path: Path, what: str) -> str:
    """A file's text (UTF-8); a file that cannot be read is an `InputError` ("cannot read `what`: ...")."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read {what}: {exc.strerror}", file=str(path)) from None
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text (byte {exc.start})", file=str(path)) from None


def read_mapping(text: str, source: str, what: str, not_a_mapping: str) -> tuple[dict, Any]:
    """The top-level mapping of a YAML file's text and the YAML node that locates its lines. `what`
    names the file in errors ("a scenario"); `not_a_mapping` is the error when the top level is no
    mapping."""
    if too_deep(text):
        raise InputError(f"YAML nested more than {MAX_NESTING} levels deep: not {what}", file=source)
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise InputError(f"invalid YAML: {getattr(exc, 'problem', exc)}", file=source,
                         line=mark.line + 1 if mark else None) from None
    except RecursionError:  # PyYAML composes nested nodes recursively
        raise InputError(f"YAML nested too deeply to be {what}", file=source) from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise InputError(not_a_mapping, file=source)
    return data, node


def validate(model: type[Model], data: dict, root: Any, source: str, set_keys: set[str], what: str) -> Model:
    """`data` validated as `model`, read from `source` (whose YAML nodes are `root`; `set_keys` the keys
    `--set` gave); every problem at once as an `InputError` (`describe_error`)."""
    try:
        out = model.model_validate(data)
    except ValidationError as exc:
        raise describe_error(exc, root, source, set_keys, model=model) from None
    except RecursionError:
        raise InputError(f"a value is nested too deeply to be {what} setting", file=source) from None
    out._source = source
    return out


def too_deep(text: str) -> bool:
    """Whether YAML flow collections (``[``, ``{``) nest deeper than `MAX_NESTING`, quoted text and comments
    aside: checked before PyYAML sees the text."""
    depth = 0
    quote = ""
    comment = False
    for ch in text:
        if comment:
            comment = ch != "\n"
        elif quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#":
            comment = True
        elif ch in "[{":
            depth += 1
            if depth > MAX_NESTING:
                return True
        elif ch in "]}":
            depth = max(0, depth - 1)
    return False


# --- errors placed in the file -------------------------------------------------------------------


def describe_error(exc: ValidationError, root: Any, source: str, set_keys: set[str], *,
                   model: Optional[type[BaseModel]] = None) -> InputError:
    """Every validation problem of a YAML file as one InputError (see `InputError.several`), each with its
    YAML path, its line (from the node marks of `root`) or "(from --set)", and for a misspelt key or
    choice the closest allowed one. `model` is the model validated (its fields give the allowed keys)."""
    found = [_located(problem, root, source, set_keys) for problem in validation.problems(exc, model)]
    if not found:  # pydantic reports at least one error; keep an error whatever it holds
        return InputError(str(exc).splitlines()[0], file=source)
    found.sort(key=lambda e: (e.line is None, e.line or 0))  # file order, then the --set ones
    return InputError.several(found)


def _located(problem: validation.Problem, root: Any, source: str, set_keys: set[str]) -> InputError:
    """One problem placed in the file, or named as coming from --set."""
    loc = list(problem.loc)
    dotted = problem.dotted
    set_key = _set_key_of(dotted, loc, root, set_keys)
    if set_key is None:
        message, line = problem.text(), line_of(root, loc)
    else:
        spelled = None
        if problem.is_key and problem.suggestion is not None:
            # name the whole --set key as it should read: `run.max_taks` -> `run.max_tasks`
            fixed = ".".join([*(str(p) for p in loc[:-1]), problem.suggestion])
            below = set_key == dotted or set_key.startswith(dotted + ".")
            spelled = fixed + set_key[len(dotted):] if below else fixed
        message, line = f"{problem.text(spelled)} (from --set)", None
    return InputError(message, file=source, line=line, path=dotted or "$", field=problem.field)


def _set_key_of(dotted: str, loc: list, root: Any, set_keys: set[str]) -> Optional[str]:
    """The --set key a problem at `dotted` comes from: one that set this value or a value around it, or
    one under a section only --set made (the file has none); None when the value is the file's."""
    keys = sorted(set_keys)
    for key in keys:
        if dotted == key or dotted.startswith(key + "."):
            return key
    held = _depth_in_file(root, loc) if keys else len(loc)
    if held < len(loc):
        made = ".".join(str(p) for p in loc[:held + 1])  # the first part of the path the file lacks
        for key in keys:
            if key == made or key.startswith(made + "."):
                return key
    return None


def _depth_in_file(node: Any, loc: list) -> int:
    """How many leading parts of `loc` the YAML holds nodes for."""
    for depth, part in enumerate(loc):
        if isinstance(node, yaml.MappingNode):
            node = next((value for key, value in node.value if key.value == str(part)), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
        else:
            node = None
        if node is None:
            return depth
    return len(loc)


def line_of(node: Any, loc: list) -> Optional[int]:
    """1-based line of the YAML node at `loc` (the deepest one that exists)."""
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if key.value == str(part):
                    # a bad or unknown key is best pointed at by the key itself
                    node, line = value, key.start_mark.line + 1
                    break
            else:
                return line
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line
