"""The quality check: did a config change the model's answers?

Before a live config's load, a fixed probe set goes to its server one probe at a time (so no batching
changes the numerics): the first call of each of the first N top-level tasks of the workload, as the
same token-id prompt (or chat text) a run would send, greedy (temperature 0), a fixed number of output
tokens (end-of-sequence ignored), with each output token's log probability when the server gives them.
Each config's outputs are compared with the base config's, probe by probe: the share of identical
outputs, the mean length of the common prefix (tokens; characters when the server gave no tokens),
and the mean |difference| of log probabilities over that common prefix. A variant is flagged when fewer
of its outputs than `flag_below` are identical (it changed what the model says), or when its log
probabilities moved by more than `logprob_tolerance` on average (it changed the numerics: a dtype, a
quantization, a kernel; a few short probes may not show that in the text, a longer answer would). The
same numerics give the same log probabilities bit for bit, probe by probe, so a config that only
changes scheduling (probes go one at a time) moves them by 0.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional

import aiohttp

from ..behaviour import CallRequest
from ..live.client import Target, error_message
from ..live.prompts import PromptBuilder
from ..workload import Workload
from .schema import QualitySpec


class ProbeError(RuntimeError):
    """A probe got no usable answer."""


@dataclass
class ProbeOutput:
    """One probe's answer: its tokens (or characters) and their log probabilities (None: not given)."""

    tokens: list[str]
    logprobs: Optional[list[Optional[float]]]
    unit: str
    """'tokens', or 'characters' when the server gave text only."""


def probe_requests(workload: Workload, count: int) -> list[CallRequest]:
    """The first call of each of the first `count` top-level tasks, in arrival order."""
    tasks = sorted(workload.tasks, key=lambda t: t.arrival)[:count]
    return [CallRequest(t.id, t.task_class, 0, t.calls[0]) for t in tasks if t.calls]


async def run_probes(target: Target, requests: list[CallRequest], spec: QualitySpec, seed: int) -> list[ProbeOutput]:
    """Send each probe in turn to `target`; ProbeError at the first that fails."""
    prompts = PromptBuilder(vocab_size=target.vocab_size, share_prefixes=target.share_prefixes, seed=seed)
    headers = {"Content-Type": "application/json", **target.headers}
    if target.api_key:
        headers["Authorization"] = f"Bearer {target.api_key}"
    timeout = aiohttp.ClientTimeout(total=target.total_timeout or 600, sock_connect=target.connect_timeout)
    async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
        model = target.model or await _first_model(session, target.root)
        outputs = []
        for request in requests:
            body: dict[str, Any] = {"model": model, "max_tokens": spec.max_tokens, "min_tokens": spec.max_tokens,
                                    "ignore_eos": True, "temperature": 0}
            if target.api == "chat":
                body["messages"] = prompts.messages(request)
                if spec.logprobs:
                    body["logprobs"] = True
            else:
                body["prompt"] = prompts.token_ids(request)
                if spec.logprobs:
                    body["logprobs"] = 1
            outputs.append(_output(await _post(session, target.root, target.api, body), target.api))
    return outputs


async def _first_model(session: aiohttp.ClientSession, root: str) -> str:
    async with session.get(root + "/v1/models") as resp:
        data = await resp.read()
        if resp.status >= 400:
            raise ProbeError(f"GET /v1/models: HTTP {resp.status}: {error_message(data)}")
    try:
        return str(json.loads(data)["data"][0]["id"])
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise ProbeError(f"GET /v1/models: unexpected answer ({exc})") from None


async def _post(session: aiohttp.ClientSession, root: str, api: str, body: dict[str, Any]) -> dict[str, Any]:
    path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
    try:
        async with session.post(root + path, json=body) as resp:
            data = await resp.read()
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise ProbeError(f"POST {path}: {type(exc).__name__}: {exc}") from None
    if resp.status >= 400:
        raise ProbeError(f"POST {path}: HTTP {resp.status}: {error_message(data)}")
    try:
        return json.loads(data)["choices"][0]
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise ProbeError(f"POST {path}: unexpected answer ({exc})") from None


def _output(choice: dict[str, Any], api: str) -> ProbeOutput:
    """A probe's tokens and log probabilities from the server's choice (characters when no tokens)."""
    logprobs = choice.get("logprobs") or {}
    if api == "chat":
        content = logprobs.get("content") if isinstance(logprobs, dict) else None
        if content:
            return ProbeOutput([str(c.get("token")) for c in content], [c.get("logprob") for c in content], "tokens")
        return ProbeOutput(list((choice.get("message") or {}).get("content") or ""), None, "characters")
    tokens = logprobs.get("tokens") if isinstance(logprobs, dict) else None
    if tokens:
        return ProbeOutput([str(t) for t in tokens], list(logprobs.get("token_logprobs") or []) or None, "tokens")
    return ProbeOutput(list(choice.get("text") or ""), None, "characters")


def unmeasured(status: str, note: Optional[str], probes: int = 0) -> dict[str, Any]:
    """study.json's ``quality`` of a config whose outputs were not compared (n/a, failed)."""
    return {"status": status, "reason": None, "probes": probes, "identical_share": None,
            "mean_common_prefix_tokens": None, "mean_abs_logprob_delta": None, "note": note}


def compare(base: list[ProbeOutput], other: list[ProbeOutput], spec: QualitySpec) -> dict[str, Any]:
    """The config's outputs against the base's (study.json's ``quality`` of a variant); ``reason`` says
    what flagged it: 'outputs' or 'logprobs'."""
    n = min(len(base), len(other))
    if n == 0:
        return unmeasured("failed", "no probe answered")
    identical, prefixes, deltas = 0, [], []
    for a, b in zip(base[:n], other[:n]):
        common = 0
        for x, y in zip(a.tokens, b.tokens):
            if x != y:
                break
            common += 1
        identical += a.tokens == b.tokens
        prefixes.append(common)
        if a.logprobs and b.logprobs:
            deltas += [abs(x - y) for x, y in zip(a.logprobs[:common], b.logprobs[:common])
                       if x is not None and y is not None]
    share = identical / n
    delta = statistics.fmean(deltas) if deltas else None
    reason = None
    if share < spec.flag_below:
        reason = "outputs"
    elif delta is not None and spec.logprob_tolerance is not None and delta > spec.logprob_tolerance:
        reason = "logprobs"
    unit = base[0].unit
    return {
        "status": "flagged" if reason else "same", "reason": reason, "probes": n, "identical_share": share,
        "mean_common_prefix_tokens": statistics.fmean(prefixes), "mean_abs_logprob_delta": delta,
        "note": None if unit == "tokens" else "the server gave no tokens: common prefix in characters",
    }


def save(path: Path, outputs: list[ProbeOutput]) -> None:
    """Write a config's probe outputs (quality/NAME.json)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([asdict(o) for o in outputs]) + "\n")


def read(path: Path) -> Optional[list[ProbeOutput]]:
    """A config's saved probe outputs (None when absent or unreadable)."""
    try:
        return [ProbeOutput(**o) for o in json.loads(path.read_text())]
    except (OSError, ValueError, TypeError):
        return None
