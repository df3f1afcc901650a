"""Property: whatever bytes a trace file holds, in any format, and whatever a scenario says, loading gives a
sound workload or an `InputError`, never another exception (the cases: tests/input_fuzzing.py).

Hypothesis draws each case's random choices, a bounded number per kind so the file runs in tens of
seconds; benchmarks/fuzz_inputs.py runs the same cases by the hundred thousand.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from input_fuzzing import Fuzzer, check_workload, seeds
from simulator.traces import load
from simulator.workload import Call, SubTask, Task, Workload

KINDS = sorted(seeds()) + ["folder", "scenario"]


@pytest.fixture(scope="module")
def fuzzer(tmp_path_factory) -> Fuzzer:
    return Fuzzer(tmp_path_factory.mktemp("fuzz"))


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(rng=st.randoms(use_true_random=False))
def test_any_input_gives_a_sound_workload_or_an_input_error(fuzzer, kind, rng):
    outcome = fuzzer.case(kind, rng)
    assert outcome.kind in ("valid", "input_error"), f"{kind}: {outcome.kind}: {outcome.detail}"


def test_every_seed_loads_as_a_sound_workload(tmp_path):
    for fmt, (suffix, data) in seeds().items():
        path = tmp_path / f"{fmt}{suffix}"
        path.write_bytes(data)
        assert check_workload(load([path])) is None, fmt


def test_the_check_finds_what_is_wrong_with_a_workload():
    good = Task("t", (Call(10, 2, hash_ids=(1, 2), block_size=4),))
    assert check_workload(Workload((good,))) is None
    for bad in (
        Task("t", (Call(2**63, 2),)),
        Task("t", (Call(10, 2, gap=float("nan")),)),
        Task("t", (Call(10, 2, sent_at=float("inf")),)),
        Task("t", (Call(10, 2, hash_ids=(True, 2), block_size=4),)),
        Task("t", (Call(10, 2, hash_ids=(-1,), block_size=4),)),
        Task("t", (Call(10, 2),), subtasks=(SubTask(3, Task("s", (Call(1, 1),))),)),
    ):
        assert check_workload(Workload((bad,))) is not None, bad


def test_the_cases_reach_every_outcome_they_should(fuzzer):
    """The mutations are strong enough to make bad input and mild enough to leave good input."""
    seen = {kind: set() for kind in KINDS}
    for kind in KINDS:
        for i in range(60):
            seen[kind].add(fuzzer.case(kind, random.Random(f"{kind}-{i}")).kind)
    assert all({"valid", "input_error"} <= kinds for kinds in seen.values()), seen
