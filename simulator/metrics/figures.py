"""The base of every part of a result file's typed model (`Figures`)."""

from __future__ import annotations

from typing import Any, Mapping, Self

from pydantic import BaseModel, ConfigDict


class Figures(BaseModel):
    """A part of the summary. Keys it does not know are kept (a summary.json from a newer version loads
    and dumps whole); fields whose JSON name is no identifier ('p99.9') have it as their alias."""

    model_config = ConfigDict(extra="allow", validate_by_name=True, validate_by_alias=True,
                              serialize_by_alias=True, use_attribute_docstrings=True)

    @classmethod
    def pick(cls, values: Mapping[str, Any]) -> Self:
        """This part with its figures taken from `values` by their JSON names (other keys ignored)."""
        return cls.model_validate({name: values[name] for name in
                                   (f.alias or key for key, f in cls.model_fields.items())})

    def to_dict(self) -> dict[str, Any]:
        """The part as summary.json holds it: the figures that were set, in field order."""
        return self.model_dump(mode="python", exclude_unset=True)
