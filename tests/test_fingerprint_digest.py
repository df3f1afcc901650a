"""The workload fingerprint hashes a workload's tasks one at a time: the digest is the SHA-256 of the JSON
of them all written at once (what result folders already hold), views of shared hash ids included."""

from __future__ import annotations

import hashlib

import orjson

from simulator.hash_ids import HashIds, json_default
from simulator.metrics import folder
from simulator.workload import Call, SubTask, Task, Workload


def whole(value) -> str:
    data = orjson.dumps(value, default=json_default, option=orjson.OPT_SORT_KEYS)
    return "sha256:" + hashlib.sha256(data).hexdigest()


def test_the_digest_of_tasks_one_at_a_time_is_that_of_their_json_written_at_once():
    chain = HashIds.of(tuple(range(7, 400)))
    child = Task("c", (Call(10, 5, hash_ids=(1, 2, 3)),), task_class="sub")
    tasks = tuple(Task(f"t{i}", tuple(Call(64 * k, 9, gap=0.5 * k, hash_ids=chain[:k * 40], block_size=64)
                                     for k in range(1, 5)), arrival=i / 3,
                       subtasks=(SubTask(-1, child),) if i == 2 else ())
                  for i in range(6))
    for value in (tasks, list(tasks), tasks[:1], (), [], {"b": [1, 2.5], "a": None}, [{"x": 1}, "y"]):
        assert folder._digest(value) == whole(value)
    assert folder.fingerprint(Workload(tasks))["workload"] == whole(tasks)
