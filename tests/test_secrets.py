"""Secrets never reach a file or the console: recognisable secrets in every place a user can put one
(the URL's user and password, header values, the API key's environment variable, the emulator's key),
then every file of the result folders and everything printed (run, report, errors) searched for them
and for their base64 form (HTTP Basic auth)."""

from __future__ import annotations

import base64
from pathlib import Path

from reliability_helpers import emulator_thread, free_port, scenario_file
from simulator.cli import main
from simulator.redact import MASK, Redactor, mask_settings, mask_url

USER, PASSWORD = "userSECRETa1", "pwSECRETb2"
HEADER_KEY, HEADER_TOKEN, COOKIE = "hdrSECRETc3", "tokSECRETd4", "ckSECRETe5"
API_KEY, EMULATOR_KEY = "keySECRETf6", "emuSECRETg7"
SECRETS = (USER, PASSWORD, HEADER_KEY, HEADER_TOKEN, COOKIE, API_KEY, EMULATOR_KEY)


def forms(secret: str) -> list[str]:
    return [secret, base64.b64encode(secret.encode()).decode().rstrip("=")]


def assert_nothing_leaked(texts: list[str], folders: list[Path]) -> None:
    needles = [f for s in SECRETS for f in forms(s)] + forms(f"{USER}:{PASSWORD}")
    for folder in folders:
        files = [p for p in folder.rglob("*") if p.is_file()]
        assert files, folder
        for path in files:
            data = path.read_bytes().decode("utf-8", "replace")
            for needle in needles:
                assert needle not in data, f"{needle} in {path}"
    for text in texts:
        for needle in needles:
            assert needle not in text, f"{needle} printed"


def headers() -> str:
    return f"headers: {{X-Api-Key: {HEADER_KEY}, X-Tenant-Token: 'Bearer {HEADER_TOKEN}', Cookie: 'session={COOKIE}'}}"


def test_no_secret_reaches_a_file_or_the_console(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("AGENTLOAD_SECRET_KEY", API_KEY)
    printed, folders = [], []

    def run(name: str, scenario: Path, *extra: str) -> int:
        folder = tmp_path / name
        code = main(["run", str(scenario), "-o", str(folder), "--no-progress", *extra])
        if folder.exists():
            folders.append(folder)
            for args in (["report", str(folder)], ["report", str(folder), "--json"]):
                assert main(args) == 0
        out, err = capsys.readouterr()
        printed.extend((out, err))
        return code

    with emulator_thread(ttft=0.001, itl=0.001) as open_server:
        host = open_server.url.removeprefix("http://")
        # credentials in the URL, keys in headers; a run, a wrong model, a server that is not there
        with_url = scenario_file(tmp_path, f"target: {{base_url: 'http://{USER}:{PASSWORD}@{host}', {headers()}}}\n")
        assert run("url", with_url) == 0
        assert run("model", with_url, "--set", "target.model=missing") == 3
        gone = scenario_file(tmp_path, f"target: {{base_url: 'http://{USER}:{PASSWORD}@127.0.0.1:{free_port()}'}}\n")
        assert run("gone", gone) == 3
        # credentials twice: a configuration error that must not print them either
        twice = scenario_file(tmp_path, f"target: {{base_url: 'http://{USER}:{PASSWORD}@{host}', "
                                        "api_key_env: AGENTLOAD_SECRET_KEY}\n")
        assert run("twice", twice) == 2
        # and set on the command line
        plain = scenario_file(tmp_path, f"target: {{base_url: '{open_server.url}'}}\n")
        assert run("set", plain, "--set", f"target.headers={{X-Api-Key: {HEADER_KEY}}}",
                   "--set", f"target.base_url=http://{USER}:{PASSWORD}@{host}") == 0
    with emulator_thread(ttft=0.001, itl=0.001, api_key=API_KEY) as keyed:
        with_key = scenario_file(tmp_path, f"target: {{base_url: '{keyed.url}', api_key_env: AGENTLOAD_SECRET_KEY, "
                                           f"{headers()}}}\n")
        assert run("key", with_key) == 0
    # the built-in emulator with a key of its own (the run authenticates with it)
    builtin = scenario_file(tmp_path, f"emulator: {{ttft: 0.001, itl: 0.001, api_key: {EMULATOR_KEY}}}\n")
    assert run("builtin", builtin) == 0
    assert {f.name for f in folders} == {"url", "set", "key", "builtin"}
    assert_nothing_leaked(printed, folders)
    # what is shown instead
    run_json = (tmp_path / "url" / "run.json").read_text()
    assert f"{MASK}@{host}" in run_json and '"X-Api-Key": "***"' in run_json
    assert any(f"{MASK}@127.0.0.1" in text for text in printed)


def test_masking_and_redaction():
    assert mask_url("https://u:p@example.com:8443/v1?key=abc&x=1") == "https://***@example.com:8443/v1?key=***&x=***"
    assert mask_url("http://localhost:8000") == "http://localhost:8000"
    settings = {"target": {"base_url": "http://a:b@h", "headers": {"X-Api-Key": "k"}}, "emulator": {"api_key": "e"}}
    masked = mask_settings(settings)
    assert masked == {"target": {"base_url": "http://***@h", "headers": {"X-Api-Key": MASK}},
                      "emulator": {"api_key": MASK}}
    assert settings["target"]["headers"]["X-Api-Key"] == "k"  # the scenario's own settings are untouched
    redact = Redactor(["sk-12345678", "abc"])
    basic = base64.b64encode(b"sk-12345678").decode().rstrip("=")
    assert redact(f"Incorrect API key provided: sk-12345678 ({basic})") == "Incorrect API key provided: *** (***)"
    assert redact("abc stays: too short to search for") == "abc stays: too short to search for"
    assert redact(None) is None
