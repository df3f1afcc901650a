"""Fixtures that several test modules share, made once a session."""

from __future__ import annotations

from pathlib import Path

import pytest

import report_folders as rf


@pytest.fixture(scope="session")
def report_runs(tmp_path_factory) -> dict[str, Path]:
    """The result folders the report tests read: `agentload run` of `report_folders`' scenario on the
    emulator (``live``), and `agentload simulate` of it (``sim``) and of another workload (``other``).
    Tests only read them; one that changes a folder works on a copy."""
    tmp = tmp_path_factory.mktemp("report-runs")
    return {"live": rf.live_run(tmp), "sim": rf.simulation(tmp, "sim"), "other": rf.simulation(tmp, "other", 1)}
