"""`agentload record` as agents and servers see it: answers passed through unchanged (streams, usage the
client did not ask for taken out again, upstream errors), every recorded file free of content and secrets,
a recording that survives the recorder being killed, rotation, and a file read while it grows."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path

import aiohttp
import orjson
import pytest

from recorder_runs import emulator, recorder
from simulator.cli import main
from simulator.emulator.faults import FAULT_HEADER
from simulator.errors import InputError
from simulator.traces import load

MODEL = "agentload-emulator"


async def _post(session: aiohttp.ClientSession, url: str, body: dict, headers: dict | None = None) -> tuple[int, bytes]:
    async with session.post(url, json=body, headers=headers or {}) as resp:
        return resp.status, await resp.read()


def _events(raw: bytes) -> list:
    return [e[6:] for e in raw.split(b"\n\n") if e.startswith(b"data: ")]


def _wait_lines(path: Path, n: int, deadline: float = 60.0) -> list[dict]:
    """The recording's lines once it holds `n` call lines (the recorder writes each as its call ends)."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        lines = [json.loads(x) for x in path.read_text().splitlines()[1:]] if path.exists() else []
        if len(lines) >= n:
            return lines
        time.sleep(0.02)
    raise AssertionError(f"{path} did not reach {n} lines")


def test_answers_pass_through_and_usage_is_asked_for_and_taken_out_again(tmp_path):
    out = tmp_path / "rec.jsonl"

    async def go(direct: str, proxy: str) -> None:
        async with aiohttp.ClientSession() as s:
            for api, body in (("chat", {"messages": [{"role": "user", "content": "one two three four " * 10}]}),
                              ("completions", {"prompt": list(range(10, 60))})):
                path = "/v1/chat/completions" if api == "chat" else "/v1/completions"
                for usage in (False, True):
                    req = {"model": MODEL, "max_tokens": 6, "stream": True, **body}
                    if usage:
                        req["stream_options"] = {"include_usage": True}
                    status_d, raw_d = await _post(s, direct + path, req)
                    status_p, raw_p = await _post(s, proxy + path, req)
                    assert status_d == status_p == 200
                    ev_d, ev_p = _events(raw_d), _events(raw_p)
                    assert len(ev_d) == len(ev_p)  # the same events, the usage one only when asked for
                    assert (b'"usage"' in raw_p) == usage
                    assert ev_p[-1] == b"[DONE]"
                # not streamed: the same JSON but for the response id and time
                whole = {"model": MODEL, "max_tokens": 6, **body}
                (sd, rd), (sp, rp) = await _post(s, direct + path, whole), await _post(s, proxy + path, whole)
                strip = lambda raw: {k: v for k, v in orjson.loads(raw).items() if k not in ("id", "created")}
                assert sd == sp == 200 and strip(rd) == strip(rp)
            # other paths pass through
            async with s.get(proxy + "/v1/models") as resp:
                assert resp.status == 200 and (await resp.json())["data"][0]["id"] == MODEL

    with emulator() as (emu, _), recorder(emu, out) as (rec, proc):
        asyncio.run(go(emu, rec))
        lines = _wait_lines(out, 6)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
    assert all(line["output_tokens"] == 6 and line["input_tokens"] > 0 for line in lines)
    assert all(line.get("hash_ids") or line.get("hash_keep") for line in lines)  # chat through /tokenize
    assert sum("ttft" in line for line in lines) == 4  # the streamed ones


def test_upstream_errors_pass_through_unchanged_and_are_counted(tmp_path):
    out = tmp_path / "rec.jsonl"

    async def go(direct: str, proxy: str) -> None:
        async with aiohttp.ClientSession() as s:
            body = {"model": MODEL, "prompt": list(range(10, 40)), "max_tokens": 4}
            for fault in ("http_503", "http_429"):
                got = [await _post(s, url + "/v1/completions", body, {FAULT_HEADER: fault}) for url in (direct, proxy)]
                assert got[0][0] == got[1][0] == int(fault[5:]) and got[0][1] == got[1][1]
            status, raw = await _post(s, proxy + "/v1/completions", {**body, "model": "no-such-model"})
            assert status == 404 and b"no-such-model" in raw

    with emulator() as (emu, _), recorder(emu, out) as (rec, proc):
        asyncio.run(go(emu, rec))
        _wait_lines(out, 3)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        stderr = proc.log().decode()
    assert sorted(line["status"] for line in _wait_lines(out, 3)) == [404, 429, 503]
    assert "3 failed" in stderr and "HTTP 429: 1" in stderr and "HTTP 503: 1" in stderr
    with pytest.raises(InputError, match="no tasks"):  # failed calls only: nothing to replay
        load([out])


def test_an_unreachable_upstream_answers_502_without_its_credentials(tmp_path):
    out = tmp_path / "rec.jsonl"
    with recorder("http://admin:hunter2-secret@127.0.0.1:9/v1", out) as (rec, proc):
        async def go() -> tuple[int, bytes]:
            async with aiohttp.ClientSession() as s:
                return await _post(s, rec + "/v1/completions", {"model": MODEL, "prompt": [1, 2, 3]})
        status, raw = asyncio.run(go())
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        logs = proc.log()
    assert status == 502 and b"unreachable" in raw and b"hunter2" not in raw and b"admin" not in raw
    assert b"hunter2" not in logs and b"hunter2" not in out.read_bytes()


def test_no_content_and_no_secret_reaches_any_file_or_log(tmp_path):
    """Prompts carry marker strings, requests carry keys in headers, the upstream URL a password: none of
    them appears in anything the recorder wrote or printed."""
    folder = tmp_path / "rec"
    markers = ["MARKER-PROMPT-7f3a", "MARKER-SYSTEM-c01d", "MARKER-TEXT-9e22", "MARKER-ANSWER-not-sent"]
    secrets = ["Bearer-SECRET-KEY-123", "SECRET-HDR-456", "SESSION-VALUE-789", "UPSTREAM-PW-0ab1", "upstream-user-x"]

    async def go(proxy: str) -> None:
        headers = {"Authorization": "Bearer Bearer-SECRET-KEY-123", "x-api-key": "SECRET-HDR-456",
                   "x-session-id": "SESSION-VALUE-789", "cookie": "sid=SECRET-HDR-456"}
        async with aiohttp.ClientSession() as s:
            for stream in (False, True):
                chat = {"model": MODEL, "max_tokens": 5, "stream": stream, "messages": [
                    {"role": "system", "content": "you are MARKER-SYSTEM-c01d " * 20},
                    {"role": "user", "content": "please MARKER-PROMPT-7f3a " * 30}]}
                assert (await _post(s, proxy + "/v1/chat/completions", chat, headers))[0] == 200
                text = {"model": MODEL, "max_tokens": 5, "stream": stream, "prompt": "MARKER-TEXT-9e22 " * 40}
                assert (await _post(s, proxy + "/v1/completions?key=SECRET-HDR-456", text, headers))[0] == 200

    with emulator() as (emu, _):
        upstream = emu.replace("http://", "http://upstream-user-x:UPSTREAM-PW-0ab1@")
        with recorder(upstream, folder / "traffic.jsonl", "--rotate-size", "0.0005") as (rec, proc):
            asyncio.run(go(rec))
            _wait_lines(folder / "traffic.jsonl", 1)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0
            logs = proc.log()
    files = sorted(folder.iterdir())
    assert len(files) >= 2  # rotated
    recording = load([folder])
    assert recording.counts()[1] == 4 and all(c.hash_ids for t in recording.tasks for s in t.walk() for c in s.calls)
    for blob in [p.read_bytes() for p in files] + [logs]:
        for needle in markers + secrets:
            assert needle.encode() not in blob, needle


def test_a_killed_recorder_keeps_every_call_it_finished_and_the_file_reads_while_it_grows(tmp_path):
    out = tmp_path / "rec.jsonl"

    async def calls(proxy: str, n: int) -> None:
        async with aiohttp.ClientSession() as s:
            prompt = list(range(10, 200))
            for i in range(n):
                prompt = prompt + list(range(300 + 20 * i, 320 + 20 * i))
                status, _ = await _post(s, proxy + "/v1/completions",
                                        {"model": MODEL, "prompt": prompt, "max_tokens": 3, "stream": True})
                assert status == 200

    with emulator() as (emu, _), recorder(emu, out, "--status-every", "0.05") as (rec, proc):
        asyncio.run(calls(rec, 5))
        _wait_lines(out, 5)
        assert main(["trace", "inspect", str(out)]) == 0  # read while the recorder runs
        end = time.monotonic() + 60
        while b"5 call(s) recorded, 0 failed" not in proc.log() and time.monotonic() < end:
            time.sleep(0.02)  # its status line, said once the count moved
        assert b"5 call(s) recorded, 0 failed" in proc.log()
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
    with open(out, "ab") as fh:
        fh.write(b'{"task":"t1","i":5,"t":9.0,"en')  # a line the kill cut short
    recording = load([out])
    (task,) = recording.tasks
    assert len(task.calls) == 5 and [len(c.hash_ids) for c in task.calls] == [(190 + 20 * k) // 16 for k in range(1, 6)]
    assert any("cut short" in note for note in recording.provenance[0].notes)
