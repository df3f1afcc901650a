"""vLLM's OpenAI-compatible API rules, as the emulator applies them: reading a request body into prompt
token ids and a token budget, and answering errors in vLLM's JSON shape and words (as of vLLM 0.32)."""

from __future__ import annotations

import zlib
from typing import Any

import orjson
from aiohttp import web

# Tokens the emulator's pretend chat template adds: a few per conversation and per message.
TEMPLATE_TOKENS = 3
TEMPLATE_TOKENS_PER_MESSAGE = 4

ERROR_TYPES = {
    400: "BadRequestError",
    401: "Unauthorized",
    404: "NotFoundError",
    429: "TooManyRequestsError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class RequestError(Exception):
    """A request the emulator answers with an error status, in vLLM's JSON shape."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def error_response(status: int, message: str) -> web.Response:
    """vLLM's error body: ``{"error": {"message", "type", "param", "code"}}``."""
    body = {"error": {"message": message, "type": ERROR_TYPES.get(status, "Error"), "param": None, "code": status}}
    return web.json_response(body, status=status)


async def read_body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object; anything else is a `RequestError`."""
    try:
        body = orjson.loads(await request.read())
    except ValueError as exc:  # orjson's errors (bad JSON, bad UTF-8) are ValueErrors
        raise RequestError(400, f"Invalid JSON body: {exc}") from None
    if not isinstance(body, dict):
        raise RequestError(400, "Request body must be a JSON object")
    return body


def word_id(word: str, vocab_size: int) -> int:
    """The pretend tokenizer: one token id per word, stable across runs and processes."""
    return 10 + zlib.crc32(word.encode()) % max(1, vocab_size - 20)


def prompt_ids(body: dict[str, Any], chat: bool, vocab_size: int) -> list[int]:
    """The prompt's token ids: the chat `messages` through the pretend template, or the `prompt` (text,
    token ids, or a one-element list of either)."""
    if chat:
        return _chat_ids(body.get("messages"), vocab_size)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (list, str)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return [word_id(w, vocab_size) for w in prompt.split()]
    # set(map(type, ...)), min and max run in C: a per-token Python check was a third of a request's cost
    if isinstance(prompt, list) and set(map(type, prompt)) <= {int}:
        if not prompt:
            raise RequestError(400, "Prompt cannot be empty")
        if min(prompt) < 0 or max(prompt) >= vocab_size:
            bad = next(t for t in prompt if not 0 <= t < vocab_size)
            raise RequestError(400, f"Token id {bad} is out of vocabulary")
        return prompt
    raise RequestError(400, "'prompt' must be a string, a list of token ids, or a one-element list of either")


def _chat_ids(messages: Any, vocab_size: int) -> list[int]:
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "'messages' must be a non-empty list")
    ids = [1, 2, 3][:TEMPLATE_TOKENS]
    for message in messages:
        if not isinstance(message, dict) or "role" not in message:
            raise RequestError(400, "each message must be an object with a 'role'")
        content = message.get("content") or ""
        if isinstance(content, list):
            content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
        if not isinstance(content, str):
            raise RequestError(400, "message 'content' must be a string or a list of parts")
        ids.extend((4, word_id(str(message["role"]), vocab_size), 5, 6)[:TEMPLATE_TOKENS_PER_MESSAGE])
        ids.extend(word_id(w, vocab_size) for w in content.split())
    return ids


def max_tokens_of(body: dict[str, Any], prompt_len: int, chat: bool, model: str, max_model_len: int) -> int:
    """Tokens to generate for a request of `prompt_len` prompt tokens to the served `model`, after
    vLLM's checks of the sampling parameters and the context length."""
    requested = body.get("model")
    if requested is not None and requested != model:
        raise RequestError(404, f"The model `{requested}` does not exist.")
    if body.get("n", 1) != 1:
        raise RequestError(400, "the emulator supports n=1 only")
    temperature = body.get("temperature", 1.0)
    if not isinstance(temperature, (int, float)) or temperature < 0:
        raise RequestError(400, f"temperature must be non-negative, got {temperature}.")
    if body.get("stream_options") is not None and not body.get("stream"):
        raise RequestError(400, "Stream options can only be defined when `stream=True`.")
    key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = body.get(key)
    if max_tokens is None:
        max_tokens = max_model_len - prompt_len if chat else 16
    if type(max_tokens) is not int or max_tokens < 1:
        raise RequestError(400, f"max_tokens must be at least 1, got {max_tokens}.")
    if prompt_len > max_model_len:
        raise RequestError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, your prompt "
            f"contains {prompt_len} input tokens, which exceeds this limit even without any output "
            f"tokens. Please reduce the length of the input prompt. "
            f"(parameter=input_tokens, value={prompt_len})",
        )
    # vLLM caps max_tokens at what the context leaves, then checks min_tokens against it
    max_tokens = min(max_tokens, max_model_len - prompt_len)
    min_tokens = body.get("min_tokens", 0)
    if type(min_tokens) is not int or min_tokens < 0:
        raise RequestError(400, f"min_tokens must be greater than or equal to 0, got {min_tokens}.")
    if min_tokens > max_tokens:
        raise RequestError(400, f"min_tokens must be less than or equal to max_tokens={max_tokens}, got {min_tokens}.")
    return max_tokens
