"""A recorded call's prompt token ids: from the request itself (a completions prompt of token ids), from
the upstream's ``/tokenize`` (vLLM has it: the same tokenizer and chat template that serve the call), or
from a local tokenizer (`transformers`, from a model folder). Used only to hash the prompt into block
ids (`simulator.recorder.block_hash`); the ids and the text are never kept."""

from __future__ import annotations

import asyncio
import os
from typing import Any, Mapping, Optional, Sequence

import aiohttp
import numpy as np
import orjson

CHAT_TOKENIZE_FIELDS = ("messages", "tools", "chat_template", "chat_template_kwargs", "add_generation_prompt",
                        "continue_final_message", "add_special_tokens")
"""What of a chat request decides its prompt tokens (vLLM's /tokenize takes these)."""
TEXT_TOKENIZE_FIELDS = ("prompt", "add_special_tokens")
CREDENTIAL_HEADERS = frozenset(("authorization", "api-key", "x-api-key"))
"""A call's headers passed along to its /tokenize request."""


class TokenizeError(Exception):
    """The prompt's token ids could not be had (the call is recorded without hash ids)."""


def ids_in_request(api: str, body: Mapping[str, Any]) -> Optional[np.ndarray]:
    """The prompt's token ids when the request carries them (a completions prompt of ids), else None."""
    if api != "completions":
        return None
    prompt = body.get("prompt")
    if not isinstance(prompt, list) or not prompt or type(prompt[0]) is not int:
        return None
    try:
        return np.fromiter(prompt, dtype=np.int64, count=len(prompt))  # one pass in C
    except (TypeError, ValueError, OverflowError):  # not all ints: the server will say what is wrong
        return None


class UpstreamTokenizer:
    """Asks the upstream's ``/tokenize`` for a request's prompt tokens."""

    def __init__(self, session: aiohttp.ClientSession, root: str, auth: Optional[aiohttp.BasicAuth]) -> None:
        self.session = session
        self.url = root + "/tokenize"
        self.auth = auth

    async def ids(self, api: str, body: Mapping[str, Any], credentials: Mapping[str, str]) -> Sequence[int]:
        """`credentials`: the call's own authentication headers, sent along (the upstream may want them)."""
        fields = CHAT_TOKENIZE_FIELDS if api == "chat" else TEXT_TOKENIZE_FIELDS
        query = {name: body[name] for name in fields if name in body}
        if "model" in body:
            query["model"] = body["model"]
        if api == "completions" and not isinstance(query.get("prompt"), str):
            raise TokenizeError("the prompt is neither token ids nor one text")
        try:
            headers = {"content-type": "application/json", **credentials}
            auth = self.auth if not any(k.lower() == "authorization" for k in credentials) else None
            async with self.session.post(self.url, data=orjson.dumps(query), headers=headers, auth=auth) as resp:
                raw = await resp.read()
                if resp.status != 200:
                    raise TokenizeError(f"/tokenize answered HTTP {resp.status}")
        except aiohttp.ClientError as exc:
            raise TokenizeError(f"/tokenize failed: {type(exc).__name__}") from None
        try:
            tokens = orjson.loads(raw).get("tokens")
        except (orjson.JSONDecodeError, AttributeError):
            raise TokenizeError("/tokenize answered no JSON object") from None
        if not isinstance(tokens, list):
            raise TokenizeError("/tokenize answered no token list")
        return tokens


class LocalTokenizer:
    """A model folder's tokenizer and chat template, through `transformers` (``pip install 'agentload[record]'``)."""

    def __init__(self, folder: str) -> None:
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # not its word on PyTorch, absent here
        try:
            from transformers import AutoTokenizer  # noqa: PLC0415 - optional, heavy
        except ImportError:
            raise TokenizeError("--tokenizer needs the transformers package: pip install 'agentload[record]'") from None
        try:
            self._tok = AutoTokenizer.from_pretrained(folder)
        except (OSError, ValueError) as exc:
            raise TokenizeError(f"cannot load a tokenizer from {folder}: {exc}") from None

    async def ids(self, api: str, body: Mapping[str, Any], credentials: Mapping[str, str]) -> Sequence[int]:
        # Tokenizing a long prompt takes milliseconds of CPU: off the loop that streams other calls.
        return await asyncio.to_thread(self._ids, api, body)

    def _ids(self, api: str, body: Mapping[str, Any]) -> Sequence[int]:
        try:
            if api == "chat":
                kwargs = dict(body.get("chat_template_kwargs") or {})
                out = self._tok.apply_chat_template(
                    body["messages"], tools=body.get("tools"), tokenize=True,
                    add_generation_prompt=body.get("add_generation_prompt", True),
                    continue_final_message=body.get("continue_final_message", False), **kwargs)
                return list(out["input_ids"] if hasattr(out, "keys") else out)
            prompt = body.get("prompt")
            if not isinstance(prompt, str):
                raise TokenizeError("the prompt is neither token ids nor one text")
            return list(self._tok.encode(prompt, add_special_tokens=body.get("add_special_tokens", True)))
        except TokenizeError:
            raise
        except Exception as exc:  # noqa: BLE001 - a template that fails on this request: recorded without ids
            raise TokenizeError(f"local tokenizer failed: {type(exc).__name__}") from None
