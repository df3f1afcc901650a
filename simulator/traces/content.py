"""Prefix hash ids derived from the messages a call sent, for traces that carry content but no block hashes.

A server's prefix cache (vLLM's, the twin's, the emulator's) shares a block of a new prompt only when
every token before it and in it equals a cached prompt's: a block's identity is its whole prefix. The ids
made here follow that rule at the granularity a trace allows. A call's prompt is laid out on a token axis
of the call's recorded input tokens as a run of segments, two per message: its header (the chat
template's role markers, keyed by the role alone, so two conversations that continue with a message of
the same role share its header as a real template's tokens would) and its body (keyed by the whole
message). A full block of `block_size` tokens gets an id that hashes everything up to its end: the
segments up to the one the block ends in, and where each of them ends. Two calls therefore share a
block's id exactly when they start with the same segments laid out the same way up to that block's end:
ids are chained, as a prefix cache's block hashes are. A prompt's trailing partial block gets no id (no
cache shares it), as in every other importer.

Where segments end. Traces give the total input tokens of a call, not tokens per message. The first call
that sends a given run of leading segments fixes where each of them ends, and every later call that
starts with the same run keeps those positions (calls are laid out in the order they were sent, so in a
conversation the previous turn's prompt places the prefix of the next: exact when the counts come from
the server's tokenizer). The segments a call adds after a known run share the rest of its input tokens
in proportion to an estimate of their size: `MESSAGE_OVERHEAD` tokens for a header, and for a body its
bytes of text times a tokens-per-byte ratio that `ContentHasher.calibrate` fits to the recorded input
tokens of all the source's calls (one tokenizer made them all), else 1 / `BYTES_PER_TOKEN`. A
message shared across conversations (a common system prompt) keeps the end estimated when it was first
seen. A known run that claims more tokens than a later call has is laid out afresh for that call: its ids
then differ, and it shares nothing beyond the part it could hold (counted in `ContentHasher.notes`).

No text is kept: messages are reduced to digests as they are read.
"""

from __future__ import annotations

import hashlib
from typing import Any, Iterable, Mapping, Sequence

import orjson

from ..hash_ids import HashIds

DEFAULT_BLOCK_SIZE = 16
"""Tokens per block of content-derived ids: vLLM's default KV block size (and the emulator's)."""
MESSAGE_OVERHEAD = 4
"""Estimated tokens a chat template spends on each message (role markers, separators)."""
BYTES_PER_TOKEN = 4
"""Estimated bytes of UTF-8 text per token, before calibration."""
MIN_CALIBRATION_CALLS = 3
"""Calls (with distinct sizes) needed before the estimate is fitted to a source."""

_BASE_MASK = (1 << 62) - 1
_SKIP_KEYS = frozenset({"role", "type"})


def _digest(*parts: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        h.update(part)
    return h.digest()


def _base(layout: bytes, marker: bytes) -> int:
    return int.from_bytes(_digest(layout, marker)[:8], "little") & _BASE_MASK


def message_key(message: Any) -> bytes:
    """Canonical bytes of one message: equal for equal messages, whatever the order of their keys."""
    try:
        return orjson.dumps(message, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    except (TypeError, orjson.JSONEncodeError):  # nested too deep for orjson, or not JSON values
        return _canonical(message)


def _canonical(value: Any) -> bytes:
    """Canonical bytes of any nesting of dicts, lists and scalars, without recursion (any depth)."""
    out = []
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, bytes):  # a marker pushed below
            out.append(item)
        elif isinstance(item, Mapping):
            stack.append(b"}")
            for key in sorted(item, key=str, reverse=True):
                stack.extend((item[key], repr(str(key)).encode("utf-8", "replace") + b":"))
            out.append(b"{")
        elif isinstance(item, (list, tuple)):
            stack.append(b"]")
            stack.extend(reversed(item))
            out.append(b"[")
        else:
            out.append(repr(item).encode("utf-8", "replace") + b",")
    return b"".join(out)


def message_role(message: Any) -> str:
    """The role of a message in any of the shapes traces use (``role``, ``message.role``), '' if none."""
    if isinstance(message, Mapping):
        for key in ("role", "message.role"):
            role = message.get(key)
            if isinstance(role, str):
                return role
        inner = message.get("message")
        if isinstance(inner, Mapping) and isinstance(inner.get("role"), str):
            return inner["role"]
    return ""


def text_bytes(value: Any) -> int:
    """UTF-8 bytes of the text a message holds: every string and number in it, roles and part types aside
    (walked without recursion, so any nesting is fine)."""
    total = 0
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            total += len(item.encode("utf-8", "replace"))
        elif isinstance(item, Mapping):
            stack.extend(v for k, v in item.items()
                         if not (isinstance(k, str) and (k in _SKIP_KEYS or k.endswith(".role"))))
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif isinstance(item, (int, float)) and not isinstance(item, bool):
            total += len(repr(item))
    return total


class Estimate:
    """Estimated tokens of a prompt: ``per_message`` for each message's template markers plus
    ``per_byte`` for each byte of its text."""

    __slots__ = ("per_message", "per_byte", "fitted_on")

    def __init__(self, per_message: float = MESSAGE_OVERHEAD, per_byte: float = 1.0 / BYTES_PER_TOKEN,
                 fitted_on: int = 0) -> None:
        self.per_message = per_message
        self.per_byte = per_byte
        self.fitted_on = fitted_on
        """Calls the estimate was fitted to (0: the defaults)."""

    @classmethod
    def fit(cls, samples: Iterable[tuple[int, int, int]]) -> Estimate:
        """Tokens per byte fitted to (messages, text bytes, input tokens) of a source's calls: their input
        tokens less `MESSAGE_OVERHEAD` a message, over their bytes (a ratio estimate, which the strong
        correlation of message count and text size in a growing conversation cannot upset). The defaults
        when the calls are fewer than `MIN_CALIBRATION_CALLS` or the fit is implausible (under 0.5 or over
        16 bytes a token)."""
        rows = list(samples)
        if len(rows) < MIN_CALIBRATION_CALLS:
            return cls()
        text = sum(b for _, b, _ in rows)
        tokens = sum(n - MESSAGE_OVERHEAD * m for m, _, n in rows)
        if text <= 0 or not 1 / 16 <= tokens / text <= 2:
            return cls()
        return cls(MESSAGE_OVERHEAD, tokens / text, len(rows))

    def describe(self) -> str:
        """The estimate in words, for notes."""
        how = f"fitted to {self.fitted_on} calls" if self.fitted_on else "default"
        return f"{self.per_message:g} tokens a message + 1 per {1 / self.per_byte:.2f} bytes of text, {how}"


def _split(start: int, total: int, weights: Sequence[float]) -> list[int]:
    """Ends of consecutive segments sharing `total` tokens from `start` in proportion to `weights` (the
    last ends at ``start + total``)."""
    whole = float(sum(weights))
    ends = []
    running = 0.0
    for weight in weights:
        running += weight
        ends.append(start + (int(total * running / whole) if whole > 0 else total))
    if ends:
        ends[-1] = start + total
    return ends


class ContentHasher:
    """Gives calls block hash ids from their messages (see the module doc). Use one hasher for all the
    calls of a source, in the order they were sent: calls of different tasks share ids where they share
    leading messages. Call `calibrate` first with the source's calls to fit the size estimate."""

    def __init__(self, block_size: int = DEFAULT_BLOCK_SIZE) -> None:
        if block_size <= 0:
            raise ValueError("block_size must be positive")
        self.block_size = block_size
        self.estimate = Estimate()
        self._ends: dict[bytes, int] = {}
        self.calls = 0
        """Calls given ids."""
        self.relaid = 0
        """Calls whose known leading messages claimed more tokens than the call has: laid out afresh."""

    def calibrate(self, calls: Iterable[tuple[Sequence[Any], int]]) -> Estimate:
        """Fit the size estimate to (messages, input tokens) of a source's calls; returns it."""
        self.estimate = Estimate.fit((len(m), sum(text_bytes(x) for x in m), n) for m, n in calls if m and n > 0)
        return self.estimate

    def _segments(self, messages: Sequence[Any]) -> list[tuple[bytes, float]]:
        """(key, estimated tokens) of each segment: a header and a body per message."""
        est = self.estimate
        out = []
        for message in messages:
            out.append((b"h" + message_role(message).encode(), est.per_message))
            out.append((b"b" + message_key(message), est.per_byte * text_bytes(message)))
        return out

    def hash_ids(self, messages: Sequence[Any], input_tokens: int) -> HashIds | tuple[()]:
        """Block hash ids of a prompt of `input_tokens` tokens made of `messages` (in order); ``()`` when
        there are no messages."""
        if not messages or input_tokens <= 0:
            return ()
        segments = self._segments(messages)
        layout = b""  # hash of the segments so far and where each ends
        chain: list[tuple[int, bytes]] = []  # (end, layout up to and including that segment)
        position = 0
        known = 0
        for key, _ in segments:
            node = _digest(layout, key)
            end = self._ends.get(node)
            if end is None:
                break
            if end > input_tokens:
                self.relaid += 1
                break
            position = end
            layout = _digest(node, end.to_bytes(8, "little"))
            chain.append((end, layout))
            known += 1
        new = segments[known:]
        if new:
            ends = _split(position, input_tokens - position, [w for _, w in new])
            for (key, _), end in zip(new, ends):
                node = _digest(layout, key)
                self._ends.setdefault(node, end)
                layout = _digest(node, end.to_bytes(8, "little"))
                chain.append((end, layout))
        self.calls += 1
        return self._block_ids(chain, input_tokens)

    def _block_ids(self, chain: list[tuple[int, bytes]], input_tokens: int) -> HashIds:
        """One id per full block: the block's index plus a base hashed from the layout of the segment the block
        ends in (with a marker for blocks past the last segment: a repeated prompt's tail). The blocks ending
        in one segment so get consecutive ids, stored as one run (`simulator.hash_ids`): a call costs a few
        bytes per message, however many tokens it claims. Bases are 62-bit, so two layouts' runs meet by
        chance only with odds of about blocks / 2**62."""
        size = self.block_size
        runs = []
        block = 1  # index of the next block (its end is block * size)
        last_block = input_tokens // size
        for segment_end, layout in chain:
            upto = min(segment_end // size, last_block)
            if upto >= block:
                runs.append((_base(layout, b"") + block, upto - block + 1))
                block = upto + 1
        if block <= last_block:
            runs.append((_base(chain[-1][1], b"tail") + block, last_block - block + 1))
        return HashIds.from_runs(runs)

    def notes(self, what: str = "calls") -> list[str]:
        """What a user should know about the ids made, for a workload's provenance."""
        if not self.calls:
            return []
        text = (f"hash ids from message content for {self.calls} {what} (block size {self.block_size}); the trace "
                f"gives whole-prompt token counts only, so where each message ends is estimated "
                f"({self.estimate.describe()}), and leading messages seen before keep the ends of their first call")
        if self.relaid:
            text += (f"; {self.relaid} calls had fewer tokens than their known leading messages were given "
                     "and were laid out afresh (they share less)")
        return [text]
