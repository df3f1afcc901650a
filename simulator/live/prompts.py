"""Prompts built to exact token counts, sharing prefixes exactly as a call's hash ids say.

Token-id prompts (for ``/v1/completions``): each hash id maps, seeded by the id, to the same block of
`block_size` token ids, so two calls that share leading hash ids share an identical token prefix and
the server's prefix cache sees the recorded reuse. The rest of the prompt (after the hashed blocks, or
all of it when a call has none) starts with `UNIQUE_HEAD` token ids drawn from a seed of (task id, call
index, attempt), so it is never shared by accident: prefix caches match whole prefixes only, so what
follows a unique head is never a hit, and is filled with blocks picked (by the same seed) from a pool of
cached random blocks, which keeps long prompts cheap to build. With ``share_prefixes=False`` every block is salted per call, so nothing is shared.

Text prompts (for ``/v1/chat/completions``) follow the same plan with words instead of token ids: each
hash id maps to a block of words from a fixed list of common words, as many as make the block's tokens,
by a calibration of each word's token cost (and the chat template's overhead) measured once on the
server's ``/tokenize`` endpoint when it has one (`calibrate_text`); otherwise one token a word is assumed.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Optional

import numpy as np

from ..behaviour import CallRequest
from ..words import WORDS
from ..workload import Call

_MASK64 = (1 << 64) - 1
UNIQUE_HEAD = 32
"""Tokens at the start of a call's own part that are drawn fresh for the call."""
FILLER_BLOCK = 64
FILLER_POOL = 4096


def stable_id(text: str) -> int:
    """A process-independent 64-bit integer for a string (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


@dataclass(frozen=True, slots=True)
class TextCalibration:
    """What each word of `WORDS` costs on the target, and what the chat template adds."""

    word_costs: tuple[int, ...]
    """Tokens of ``" " + word`` for each word of `WORDS`, in order."""
    overhead_tokens: int
    """Tokens the chat template adds around a one-message conversation."""
    source: str
    """'tokenize' when measured on the server, 'assumed' otherwise."""
    check: Optional[tuple[int, int]] = None
    """(predicted, measured) tokens of a sample conversation, when measured."""

    @property
    def tokens_per_word(self) -> float:
        return sum(self.word_costs) / len(self.word_costs)

    def describe(self) -> str:
        text = (
            f"{self.tokens_per_word:.2f} tokens/word (min {min(self.word_costs)}, max {max(self.word_costs)}), "
            f"{self.overhead_tokens} template tokens ({self.source})"
        )
        if self.check:
            text += f"; sample of {self.check[0]} predicted tokens measured {self.check[1]}"
        return text


ASSUMED_CALIBRATION = TextCalibration(word_costs=(1,) * len(WORDS), overhead_tokens=0, source="assumed")


class PromptBuilder:
    """Builds the prompt of a `CallRequest`: token ids of exactly ``call.input_tokens``, or text of
    (as near as calibrated) that many tokens. Generated blocks are kept in an LRU cache."""

    def __init__(
        self,
        *,
        vocab_size: int = 32000,
        low: int = 10,
        high: Optional[int] = None,
        default_block_size: int = 16,
        seed: int = 0,
        share_prefixes: bool = True,
        cache_blocks: int = 65536,
        calibration: TextCalibration = ASSUMED_CALIBRATION,
    ) -> None:
        high = vocab_size - 10 if high is None else high
        if not 0 <= low < high:
            raise ValueError(f"token id range [{low}, {high}) is empty")
        if default_block_size <= 0:
            raise ValueError("default_block_size must be positive")
        self.low, self.high = low, high
        self.default_block_size = default_block_size
        self.seed = seed
        self.share_prefixes = share_prefixes
        self._cache_size = cache_blocks
        self._blocks: OrderedDict[tuple, tuple[list[int], bytes]] = OrderedDict()
        self._words: OrderedDict[tuple, str] = OrderedDict()
        self.calibration = calibration
        self._fillers: dict[int, tuple[list[int], bytes]] = {}
        self._pool: Optional[np.ndarray] = None
        # JSON bytes of every token id, so a prompt's JSON is joined from bytes, not formatted per call.
        self._id_text = [str(i).encode() for i in range(high)]

    # -- token ids ---------------------------------------------------------------------------------

    def _rng(self, *key: int) -> np.random.Generator:
        return np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed & _MASK64, *(k & _MASK64 for k in key)])))

    def _salt(self, request: CallRequest) -> int:
        return stable_id(f"{request.task_id}\x00{request.call_index}\x00{request.attempt}")

    def _call_draws(self, request: CallRequest, purpose: int, count: int) -> list[int]:
        """`count` 32-bit values fixed by (seed, task id, call index, attempt, purpose). On the per-call
        path a hash stream costs a tenth of seeding a numpy Generator."""
        key = f"{self.seed}\x00{purpose}\x00{request.task_id}\x00{request.call_index}\x00{request.attempt}"
        return np.frombuffer(hashlib.shake_128(key.encode()).digest(4 * count), dtype="<u4").tolist()

    def _block(self, hash_id: int, size: int, salt: int) -> tuple[list[int], bytes]:
        key = (hash_id, size, salt)
        hit = self._blocks.get(key)
        if hit is not None:
            self._blocks.move_to_end(key)
            return hit
        ids = self._rng(1, hash_id & _MASK64, size, salt).integers(self.low, self.high, size).tolist()
        entry = (ids, b",".join([self._id_text[i] for i in ids]))
        self._blocks[key] = entry
        if len(self._blocks) > self._cache_size:
            self._blocks.popitem(last=False)
        return entry

    def _plan(self, request: CallRequest) -> tuple[list[tuple[int, int]], int, int]:
        """(hashed blocks as (hash id, tokens used), tail length, salt for blocks)."""
        call = request.call
        size = call.block_size or self.default_block_size
        blocks: list[tuple[int, int]] = []
        left = call.input_tokens
        for hash_id in call.hash_ids:
            if left <= 0:
                break
            blocks.append((hash_id, min(size, left)))
            left -= size
        return blocks, max(0, left), 0 if self.share_prefixes else self._salt(request)

    def _pieces(self, request: CallRequest) -> list[tuple[list[int], bytes]]:
        call = request.call
        size = call.block_size or self.default_block_size
        blocks, tail, salt = self._plan(request)
        pieces = []
        for hash_id, used in blocks:
            ids, text = self._block(hash_id, size, salt)
            if used < size:
                ids = ids[:used]
                text = b",".join([self._id_text[i] for i in ids])
            pieces.append((ids, text))
        if tail:
            pieces.extend(self._tail(request, tail))
        return pieces

    def _tail(self, request: CallRequest, length: int) -> list[tuple[list[int], bytes]]:
        head_len = min(length, UNIQUE_HEAD)
        fillers = -(-(length - head_len) // FILLER_BLOCK)
        draws = self._call_draws(request, 2, head_len + fillers)
        span = self.high - self.low
        head = [self.low + d % span for d in draws[:head_len]]
        pieces = [(head, b",".join([self._id_text[i] for i in head]))]
        left = length - head_len
        for draw in draws[head_len:]:
            ids, text = self._filler(draw % FILLER_POOL)
            if left < FILLER_BLOCK:
                ids = ids[:left]
                text = b",".join([self._id_text[i] for i in ids])
            pieces.append((ids, text))
            left -= len(ids)
        return pieces

    def _filler(self, index: int) -> tuple[list[int], bytes]:
        hit = self._fillers.get(index)
        if hit is None:
            if self._pool is None:  # the whole pool in one draw: cheaper than one Generator a block
                self._pool = self._rng(5).integers(self.low, self.high, (FILLER_POOL, FILLER_BLOCK))
            ids = self._pool[index].tolist()
            hit = self._fillers[index] = (ids, b",".join([self._id_text[i] for i in ids]))
        return hit

    def token_ids(self, request: CallRequest) -> list[int]:
        """The prompt as exactly ``request.call.input_tokens`` token ids."""
        out: list[int] = []
        for ids, _ in self._pieces(request):
            out.extend(ids)
        return out

    def token_ids_json(self, request: CallRequest) -> bytes:
        """The same prompt as a JSON array (UTF-8 bytes), joined from cached per-block bytes (cheap for
        long prompts)."""
        return b"[" + b",".join([text for _, text in self._pieces(request) if text]) + b"]"

    # -- text --------------------------------------------------------------------------------------

    @property
    def calibration(self) -> TextCalibration:
        return self._calibration

    @calibration.setter
    def calibration(self, calibration: TextCalibration) -> None:
        self._calibration = calibration
        self._words.clear()
        costs = calibration.word_costs
        self._fits: dict[int, list[int]] = {}
        self._max_cost = max(costs)
        for limit in range(1, self._max_cost + 1):
            self._fits[limit] = [i for i, c in enumerate(costs) if c <= limit]

    def _draw_words(self, picks: list[int], tokens: int) -> str:
        """Words whose calibrated cost adds up to `tokens` (exactly, when some word costs 1 token),
        chosen by `picks` (at least `tokens` non-negative integers)."""
        costs = self._calibration.word_costs
        out: list[str] = []
        left = tokens
        for draw in picks:
            if left <= 0:
                break
            fits = self._fits.get(min(left, self._max_cost))
            if not fits:
                break
            index = fits[draw % len(fits)]
            out.append(" " + WORDS[index])
            left -= costs[index]
        return "".join(out)

    def _word_block(self, key: tuple, tokens: int) -> str:
        hit = self._words.get(key)
        if hit is not None:
            self._words.move_to_end(key)
            return hit
        text = self._draw_words(self._rng(3, *key).integers(0, 1 << 30, tokens).tolist(), tokens)
        self._words[key] = text
        if len(self._words) > self._cache_size:
            self._words.popitem(last=False)
        return text

    def text(self, request: CallRequest) -> str:
        """The prompt as text whose token count, with the chat template's overhead, is calibrated to
        ``request.call.input_tokens``; hashed blocks become shared word blocks of the same tokens.
        Every word keeps its leading space, so its cost does not depend on its neighbours."""
        call = request.call
        size = call.block_size or self.default_block_size
        budget = max(0, call.input_tokens - self._calibration.overhead_tokens)
        blocks, _, salt = self._plan(request)
        parts: list[str] = []
        for hash_id, used in blocks:
            if budget <= 0:
                break
            used = min(used, budget)
            parts.append(self._word_block((hash_id, size, salt, used), used))
            budget -= used
        if budget > 0:
            head = min(budget, UNIQUE_HEAD)
            left = budget - head
            draws = self._call_draws(request, 4, head + -(-left // FILLER_BLOCK))
            parts.append(self._draw_words(draws[:head], head))
            for pick in (d % FILLER_POOL for d in draws[head:]):
                n = min(left, FILLER_BLOCK)
                parts.append(self._word_block((pick, 0, 1, n), n))  # size 0: never a hash block's key
                left -= n
        return "".join(parts)

    def messages(self, request: CallRequest) -> list[dict[str, str]]:
        """A one-message chat conversation for the call."""
        return [{"role": "user", "content": self.text(request)}]


TokenizeFn = Callable[[dict[str, Any]], Awaitable[Optional[dict[str, Any]]]]


async def calibrate_text(tokenize: TokenizeFn, model: Optional[str], parallel: int = 16) -> TextCalibration:
    """Measure each word's token cost and the chat template's overhead on a server's ``/tokenize``.

    `tokenize(body)` posts one request and returns the parsed JSON (with ``count``), or None when the
    server has no such endpoint (or refuses); then the assumed calibration (1 token a word) is returned.
    A sample conversation built with the measured costs is tokenized as a check.
    """
    base: dict[str, Any] = {"model": model} if model else {}
    empty = await tokenize({**base, "messages": [{"role": "user", "content": ""}]})
    if not empty or "count" not in empty:
        return ASSUMED_CALIBRATION
    overhead = int(empty["count"])
    gate = asyncio.Semaphore(parallel)

    async def cost(word: str) -> Optional[int]:
        async with gate:
            answer = await tokenize({**base, "prompt": " " + word, "add_special_tokens": False})
        return int(answer["count"]) if answer and "count" in answer else None

    costs = await asyncio.gather(*(cost(w) for w in WORDS))
    if any(c is None or c <= 0 for c in costs):
        return ASSUMED_CALIBRATION
    calibration = TextCalibration(word_costs=tuple(int(c) for c in costs), overhead_tokens=overhead, source="tokenize")
    sample = PromptBuilder(calibration=calibration)
    target = overhead + 500
    probe = CallRequest("calibration", "calibration", 0, Call(input_tokens=target, output_tokens=1))
    measured = await tokenize({**base, "messages": sample.messages(probe)})
    if measured and "count" in measured:
        calibration = TextCalibration(calibration.word_costs, overhead, "tokenize", (target, int(measured["count"])))
    return calibration
