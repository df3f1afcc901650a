"""Secrets kept out of everything agentload writes or prints: URL credentials, header values, API keys.

A run's target can carry secrets in three places: the user and password of `base_url`, the values of
`target.headers` (X-Api-Key, Authorization, cookies, a tenant token) and the key read from
`api_key_env` (also the built-in emulator's `api_key`). `mask_url` and `mask_headers` give what may be
shown of them, `mask_settings` a scenario's settings as run.json holds them, and a `Redactor` takes
the secret values themselves out of any text (an error message in which a server echoes a key back).
"""

from __future__ import annotations

import base64
import copy
from typing import Any, Iterable, Mapping, Optional
from urllib.parse import SplitResult, parse_qsl, urlencode, urlsplit, urlunsplit

MASK = "***"
MIN_SECRET_LENGTH = 4
"""Shorter values are not searched for in text (they would mask unrelated characters)."""


def _split(url: str) -> Optional[SplitResult]:
    try:
        return urlsplit(url)
    except ValueError:
        return None


def url_secrets(url: str) -> list[str]:
    """The user, password and query values of a URL (what `mask_url` hides)."""
    parts = _split(url)
    if parts is None:
        return []
    found = [value for value in (parts.username, parts.password) if value]
    found += [value for _, value in parse_qsl(parts.query, keep_blank_values=False)]
    return found


def mask_url(url: str) -> str:
    """`url` with its user and password (``***@host``) and its query values (``?key=***``) masked."""
    parts = _split(url)
    if parts is None:
        return MASK
    netloc = parts.netloc
    if "@" in netloc:
        netloc = MASK + "@" + netloc.rsplit("@", 1)[1]
    query = parts.query
    if query:
        query = urlencode([(name, MASK) for name, _ in parse_qsl(query, keep_blank_values=True)], safe="*")
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


def mask_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """The header names with every value masked (any header may carry a key)."""
    return {name: MASK for name in headers}


def mask_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """A scenario's settings (``Scenario.model_dump(mode="json")``) with the target's URL credentials
    and header values and the emulator's API key masked."""
    out = copy.deepcopy(dict(settings))
    target = out.get("target")
    if isinstance(target, dict):
        if isinstance(target.get("base_url"), str):
            target["base_url"] = mask_url(target["base_url"])
        if isinstance(target.get("headers"), dict):
            target["headers"] = mask_headers(target["headers"])
    emulator = out.get("emulator")
    if isinstance(emulator, dict) and emulator.get("api_key") is not None:
        emulator["api_key"] = MASK
    return out


class Redactor:
    """Replaces each of `secrets` (and its base64 form, as HTTP Basic auth sends it) in a text by
    ``***``."""

    def __init__(self, secrets: Iterable[Optional[str]] = ()) -> None:
        found: set[str] = set()
        for secret in secrets:
            if secret and len(secret) >= MIN_SECRET_LENGTH:
                found.add(secret)
        for secret in list(found):
            found.add(base64.b64encode(secret.encode()).decode().rstrip("="))
        self.secrets = sorted(found, key=len, reverse=True)

    def __call__(self, text: Optional[str]) -> Optional[str]:
        """`text` with every secret masked (None stays None)."""
        if not text or not self.secrets:
            return text
        for secret in self.secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        return text

    def __bool__(self) -> bool:
        return bool(self.secrets)
