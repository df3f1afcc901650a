"""Which agent task a call says it belongs to: a session header, a W3C traceparent's trace id, or the
OpenAI ``user`` field, as the recorder is told to read them. The key itself is never written: the
recording names tasks ``t1``, ``t2``, ... (`simulator.recorder.grouping`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional

DEFAULT_HEADERS = ("x-session-id", "x-agentload-session", "x-smg-routing-key")
"""Session headers read by default, first found first (agentload's own replays send the last two)."""
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}")


@dataclass(frozen=True)
class KeySource:
    """Where a call's task key is read, in order: `headers`, then traceparent, then the body's ``user``."""

    headers: tuple[str, ...] = DEFAULT_HEADERS
    traceparent: bool = True
    user_field: bool = False

    def key(self, headers: Mapping[str, str], body: Optional[Mapping[str, Any]]) -> Optional[str]:
        """The call's task key, or None when it carries none of the configured ones."""
        for name in self.headers:
            value = headers.get(name)
            if value:
                return "h:" + value
        if self.traceparent:
            found = _TRACEPARENT.match(headers.get("traceparent", "").strip().lower())
            if found and found.group(1) != "0" * 32:
                return "w3c:" + found.group(1)
        if self.user_field and body is not None:
            user = body.get("user")
            if isinstance(user, str) and user:
                return "u:" + user
        return None

    def describe(self) -> dict[str, Any]:
        """The recording header's word on it (names only, never values)."""
        return {"headers": list(self.headers), "traceparent": self.traceparent, "user_field": self.user_field}
