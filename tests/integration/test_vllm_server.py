"""The real vLLM server (CPU build) behaves as the live driver expects: token-id prompts, exact
output lengths, streamed usage, prefix caching seen in /metrics and in usage, errors, chat."""

from __future__ import annotations

import json
import os

import aiohttp
import numpy as np
import pytest

from simulator.cli import main as cli_main
from simulator.live.probes import MetricsProbe
from simulator.live.vllm.server import tcmalloc_library
from simulator.live.vllm.tiny_model import SPECIAL_TOKEN

pytestmark = pytest.mark.vllm

BLOCK = 128  # vLLM's KV block size on CPU: only whole blocks are cached


def _ids(seed: int, n: int, stamp: dict) -> list[int]:
    low, high = stamp["safe_token_ids"]
    return np.random.default_rng(seed).integers(low, high, n).tolist()


async def _post(session, url, body):
    async with session.post(url, json=body) as resp:
        return resp.status, await resp.json()


async def _stream(session, url, body) -> tuple[list[dict], int]:
    """POST a streaming request; the parsed SSE data events and whether [DONE] came."""
    events, done = [], 0
    async with session.post(url, json=body) as resp:
        assert resp.status == 200, await resp.text()
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            data = line[len("data:"):].strip()
            if data == "[DONE]":
                done += 1
            else:
                events.append(json.loads(data))
    return events, done


def _completion(server, prompt, n, **extra):
    return {"model": server.model_name, "prompt": prompt, "max_tokens": n, "min_tokens": n, "ignore_eos": True, **extra}


def test_engine_runs_on_tcmalloc(vllm_server):
    """The server is started as vLLM's CPU guide asks, TCMalloc preloaded: its engine does not warn
    that the library is missing. CI installs it (libtcmalloc-minimal4); elsewhere the check needs it."""
    if tcmalloc_library() is None:
        if os.environ.get("CI"):
            pytest.fail("no TCMalloc on this machine: apt-get install libtcmalloc-minimal4")
        pytest.skip("no TCMalloc on this machine (apt-get install libtcmalloc-minimal4)")
    log = vllm_server.log_path.read_text(errors="replace")
    assert "EngineCore" in log  # the engine's own lines reach this log, so the warning would too
    assert "libtcmalloc is not found in LD_PRELOAD" not in log


async def test_models_lists_the_served_model(vllm_server):
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{vllm_server.base_url}/v1/models") as resp:
            assert resp.status == 200
            body = await resp.json()
    ids = [m["id"] for m in body["data"]]
    assert ids == [vllm_server.model_name]
    assert body["data"][0]["max_model_len"] == 4096


async def test_streamed_token_id_completion_gives_exactly_n_tokens(vllm_server, tiny_model):
    _, stamp = tiny_model
    n, prompt = 37, _ids(1, 200, stamp)
    body = _completion(vllm_server, prompt, n, stream=True, stream_options={"include_usage": True})
    async with aiohttp.ClientSession() as session:
        events, done = await _stream(session, f"{vllm_server.base_url}/v1/completions", body)
    assert done == 1
    *chunks, last = events
    assert last["choices"] == []
    assert last["usage"]["completion_tokens"] == n
    assert last["usage"]["prompt_tokens"] == len(prompt)
    texts = [c["choices"][0]["text"] for c in chunks]
    # ASCII-only vocabulary: every chunk carries text (the engine may merge tokens into one chunk).
    assert texts and all(texts) and len(texts) <= n
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


async def test_shared_prefix_hits_the_prefix_cache_and_disjoint_prompts_do_not(vllm_server, tiny_model):
    _, stamp = tiny_model
    url = f"{vllm_server.base_url}/v1/completions"
    prefix = _ids(2, 5 * BLOCK + 40, stamp)
    first, second = prefix + _ids(3, 30, stamp), prefix + _ids(4, 50, stamp)
    probe = MetricsProbe(vllm_server.base_url)
    async with aiohttp.ClientSession() as session:
        before = await probe.scrape_once()
        s1, r1 = await _post(session, url, _completion(vllm_server, first, 4))
        s2, r2 = await _post(session, url, _completion(vllm_server, second, 4))
        middle = await probe.scrape_once()
        s3, _ = await _post(session, url, _completion(vllm_server, _ids(5, 700, stamp), 4))
        s4, r4 = await _post(session, url, _completion(vllm_server, _ids(6, 700, stamp), 4))
        after = await probe.scrape_once()
    assert (s1, s2, s3, s4) == (200, 200, 200, 200)
    assert probe.failures == 0

    shared_blocks = 5 * BLOCK
    hits = middle.values["prefix_cache_hits"] - before.values["prefix_cache_hits"]
    queries = middle.values["prefix_cache_queries"] - before.values["prefix_cache_queries"]
    assert hits == shared_blocks
    assert queries == len(first) + len(second)
    # usage reports the cached part too (the launcher passes --enable-prompt-tokens-details)
    assert r1["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert r2["usage"]["prompt_tokens_details"]["cached_tokens"] == shared_blocks

    assert after.values["prefix_cache_hits"] == middle.values["prefix_cache_hits"]
    assert after.values["prefix_cache_queries"] - middle.values["prefix_cache_queries"] == 1400
    assert r4["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    summary = probe.summary()
    assert summary["prefix_cache_hit_share"] == pytest.approx(shared_blocks / (queries + 1400))


async def test_too_long_prompt_gets_vllm_error_json(vllm_server, tiny_model):
    _, stamp = tiny_model
    async with aiohttp.ClientSession() as session:
        status, body = await _post(
            session, f"{vllm_server.base_url}/v1/completions", _completion(vllm_server, _ids(7, 5000, stamp), 8)
        )
    assert status == 400
    error = body["error"]
    assert error["code"] == 400 and error["type"] == "BadRequestError"
    assert "4096" in error["message"] and "5000" in error["message"]


async def test_chat_completion_applies_the_chat_template(vllm_server):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "def main():"}]
    templated = "### system\nbe brief\n### user\ndef main():\n### assistant\n"
    async with aiohttp.ClientSession() as session:
        status, chat = await _post(
            session,
            f"{vllm_server.base_url}/v1/chat/completions",
            {"model": vllm_server.model_name, "messages": messages, "max_tokens": 6, "min_tokens": 6, "ignore_eos": True},
        )
        _, plain = await _post(session, f"{vllm_server.base_url}/v1/completions", _completion(vllm_server, templated, 1))
    assert status == 200, chat
    message = chat["choices"][0]["message"]
    assert message["role"] == "assistant" and isinstance(message["content"], str) and message["content"]
    assert SPECIAL_TOKEN not in message["content"]
    assert chat["usage"]["completion_tokens"] == 6
    # Same prompt length as the template rendered by hand: the server used our chat template.
    assert chat["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"]


def test_tiny_model_build_is_deterministic(tiny_model, vllm_venv, tmp_path, capsys):
    model_dir, stamp = tiny_model
    code = cli_main(["vllm", "tiny-model", str(tmp_path), "--force", "--python", str(vllm_venv / "bin" / "python")])
    assert code == 0
    again = json.loads(capsys.readouterr().out.strip())
    assert again["vocab_size"] == stamp["vocab_size"] == 1024
    assert again["safe_token_ids"] == [1, 1024] and again["special_token_ids"] == [0]
    for name in ("config.json", "tokenizer.json", "model.safetensors", "generation_config.json"):
        assert (tmp_path / name).read_bytes() == (model_dir / name).read_bytes(), name
