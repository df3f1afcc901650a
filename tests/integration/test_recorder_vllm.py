"""The recorder in front of a real vLLM server (CPU build, tiny model): a cut Claude Code replay sent as
chat text through `agentload record` (prompt token ids from vLLM's own /tokenize and chat template), the
recording replayed with token-id prompts against the same server: every call recorded with vLLM's token
counts, and the replay's prefix-cache hit share within 3 points of the recorded run's. A local tokenizer
(the model folder's, through transformers) gives the block ids vLLM's /tokenize gives."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import sys
from pathlib import Path

import aiohttp
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from recorder_runs import recorder  # noqa: E402
from simulator.cli import main  # noqa: E402
from simulator.traces import load  # noqa: E402

pytestmark = pytest.mark.vllm

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "vllm" / "claude-code.yaml"


def _hit_share(folder: Path) -> float:
    return json.loads((folder / "summary.json").read_text())["server"]["usage_cached_tokens"]["hit_share"]


def test_a_recording_of_vllm_traffic_replays_with_its_hit_share(vllm_server, tmp_path):
    out = tmp_path / "rec.jsonl"
    with recorder(vllm_server.base_url, out) as (url, proc):
        assert main(["run", str(SCENARIO), "-o", str(tmp_path / "recorded"), "--no-progress", "--no-preflight",
                     "--set", f"target.base_url={url}", "--set", "target.api=chat", "--set", "run.max_tasks=3",
                     "--set", "run.seed=31", "--set", "workload.stagger=0.25"]) == 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    recorded_run = tmp_path / "recorded"
    calls = [json.loads(line) for line in (recorded_run / "calls.jsonl").read_text().splitlines()]
    recording = load([out])
    recorded_calls = [c for t in recording.tasks for s in t.walk() for c in s.calls]
    assert len(recorded_calls) == len(calls) == sum(c["ok"] for c in calls)
    # vLLM's own counts: the recording's prompt and output tokens are the run's (both from usage)
    assert sorted(c.input_tokens for c in recorded_calls) == sorted(c["input_tokens"] for c in calls)
    assert sorted(c.output_tokens for c in recorded_calls) == sorted(c["output_tokens"] for c in calls)
    assert all(c.hash_ids and c.block_size == 16 for c in recorded_calls)  # ids from vLLM's /tokenize

    assert main(["run", "--trace", str(out), "--target", vllm_server.base_url, "-o", str(tmp_path / "replay"),
                 "--no-progress", "--set", "target.vocab_size=1024", "--set", "run.seed=32"]) == 0
    recorded, replayed = _hit_share(recorded_run), _hit_share(tmp_path / "replay")
    print(f"vLLM prefix-cache hit share: recorded run {recorded:.3f}, replay of the recording {replayed:.3f}")
    assert recorded > 0.3 and abs(replayed - recorded) <= 0.03


def test_a_local_tokenizer_gives_the_block_ids_vllm_tokenize_gives(vllm_server, tiny_model, tmp_path):
    """The same chat calls recorded twice, token ids from vLLM's /tokenize and from the model folder's
    tokenizer and chat template read locally (`--tokenizer DIR`, transformers): the same block ids."""
    if importlib.util.find_spec("transformers") is None:  # the `record` extra, which CI installs
        (pytest.fail if os.environ.get("CI") else pytest.skip)("transformers is not installed: pip install 'agentload[record]'")
    model_dir, _ = tiny_model
    bodies = [{"model": "tiny-llama", "max_tokens": 2, "stream": stream, "messages": [
        {"role": "system", "content": "You are a careful coding agent. " * 8},
        {"role": "user", "content": f"Step {n}: read the file and fix the test. " * (6 + 4 * n)}]}
        for n, stream in enumerate((False, True, False))]

    async def send(url: str) -> None:
        async with aiohttp.ClientSession() as session:
            for body in bodies:
                async with session.post(url + "/v1/chat/completions", json=body) as resp:
                    assert resp.status == 200, await resp.text()
                    await resp.read()

    ids = {}
    for name, extra in (("upstream", ()), ("local", ("--tokenizer", str(model_dir)))):
        out = tmp_path / f"{name}.jsonl"
        with recorder(vllm_server.base_url, out, *extra) as (url, proc):
            asyncio.run(send(url))
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0, proc.log().decode()[-2000:]
        calls = [c for t in load([out]).tasks for s in t.walk() for c in s.calls]
        ids[name] = sorted((c.input_tokens, tuple(c.hash_ids)) for c in calls)
    assert len(ids["local"]) == 3 and all(len(h) >= 4 for _, h in ids["local"])
    assert ids["local"] == ids["upstream"]
