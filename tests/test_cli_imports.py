"""Building `agentload`'s argument parser imports only what the parsers need: every command imports the
library it runs when it runs, so `agentload --help` and every command's start stay quick."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from simulator.cli import _options
from simulator.metrics.verdict import DEFAULT_MAX_FAILED_SHARE

ROOT = Path(__file__).resolve().parents[1]

HEAVY = ("scipy", "aiohttp", "simpy", "rich", "simulator.model", "simulator.metrics", "simulator.sim",
         "simulator.pipeline", "simulator.live")
"""Packages that no parser needs: numerical and network libraries, the terminal renderer, and the library's
own modelling, figures, twin, run pipelines and live client."""


def test_building_the_parser_imports_no_heavy_package():
    code = ("import json, sys\n"
            "from simulator.cli import build_parser\n"
            "build_parser()\n"
            f"heavy = {HEAVY!r}\n"
            "print(json.dumps([name for name in heavy if name in sys.modules]))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert json.loads(done.stdout) == []


def test_the_clis_default_failed_share_is_the_verdicts():
    assert _options.DEFAULT_MAX_FAILED_SHARE == DEFAULT_MAX_FAILED_SHARE
