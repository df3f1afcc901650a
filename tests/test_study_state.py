"""The study as state: the runner hands out successive `StudyState`s, each fixed once made, and
study.json is built from a state alone; study-point.json read and written through its typed model."""

from __future__ import annotations

import dataclasses
import shutil

import pytest

from simulator.errors import InputError
from simulator.study import schema
from simulator.study.points import POINT_FILE, PointFile, PointResult, run_point
from simulator.study.result import build
from simulator.study.runner import StudyRunner
from simulator.study.state import StudyState

STUDY = """\
name: state
workload:
  synthetic: {input_tokens: 32, output_tokens: 4, concurrency: 4, calls: 8}
slo:
  task_s: {p95: 30}
configs:
  base: {name: wide, profile: tiny-vllm-cpu}
  variants:
    - {name: narrow, overlay: {scheduler: {max_num_seqs: 1}}}
load: {axis: max_in_flight, points: [1, 4]}
"""


def run_study(tmp_path) -> tuple[list[StudyState], StudyState]:
    spec = schema.parse(STUDY, str(tmp_path / "study.yaml"))
    states: list[StudyState] = []
    final = StudyRunner(spec, tmp_path / "out", say=lambda line: None).run(states.append)
    return states, final


def test_the_runner_hands_out_states_that_stay_as_they_were(tmp_path):
    states, final = run_study(tmp_path)
    # one after each config and one at the end; the last is what `run` returns
    assert len(states) == 3 and states[-1] is final
    first = states[0]
    assert list(first.runs) == ["wide"] and not first.complete and first.finished_at is None
    assert [p.label for p in first.runs["wide"].points] == ["max_in_flight-1", "max_in_flight-4"]
    # the study went on after the first state was handed out, and did not change it
    assert list(final.runs) == ["wide", "narrow"] and final.complete and final.finished_at >= final.started_at
    assert final.runs["wide"] == first.runs["wide"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.complete = True  # type: ignore[misc]
    with pytest.raises(TypeError):
        first.runs["narrow"] = final.runs["narrow"]  # type: ignore[index]
    with pytest.raises(AttributeError):
        first.runs["wide"].points.append(final.runs["narrow"].points[0])  # type: ignore[attr-defined]


def test_study_json_is_built_from_the_state_alone(tmp_path):
    states, final = run_study(tmp_path)
    study = build(final).model_dump(mode="json")
    assert study["complete"] and study["finished_at"] is not None
    assert [c.name for c in build(states[0]).configs] == ["wide"]
    # nothing read from the folder, nothing from the clock: the same state, the same study.json
    shutil.rmtree(tmp_path / "out")
    assert build(final).model_dump(mode="json") == study


def point(**changes) -> PointResult:
    fields = dict(config="wide", source="sweep", label="rate-0.5", load=0.5, repeat=1, seed=4,
                  folder="points/wide/rate-0.5/r1", offered_rate=0.5, run_s=2.25,
                  gpu={"energy_j": 12.5, "utilisation_mean_perc": 40.0}, extra={"note": "x"})
    fields.update(changes)
    return PointResult(**fields)


def test_the_point_file_keeps_its_bytes_and_reads_back(tmp_path):
    written = PointFile.of(point())
    written.write(tmp_path)
    assert (tmp_path / POINT_FILE).read_text() == (
        '{\n "status": "ok",\n "error": null,\n "config": "wide",\n "source": "sweep",\n "label": "rate-0.5",\n'
        ' "repeat": 1,\n "seed": 4,\n "offered_rate": 0.5,\n "run_s": 2.25,\n'
        ' "gpu": {\n  "energy_j": 12.5,\n  "utilisation_mean_perc": 40.0\n },\n "extra": {\n  "note": "x"\n }\n}')
    assert PointFile.read(tmp_path) == written
    assert PointFile.read(tmp_path / "elsewhere") is None


def test_a_point_file_of_the_wrong_shape_is_an_error_naming_it_and_its_field(tmp_path):
    folder = tmp_path / "points/wide/rate-0.5/r1"
    folder.mkdir(parents=True)
    (folder / POINT_FILE).write_text('{"status": "ok", "config": "wide", "source": "sweep", "label": "rate-0.5", '
                                     '"repeat": 1, "seed": 4, "run_s": "fast"}')

    def never(folder):
        raise AssertionError("a point with a file is not run")

    with pytest.raises(InputError) as err:
        run_point(point(), tmp_path, never, lambda folder, summary: None)
    assert err.value.file == str(folder / POINT_FILE) and err.value.field == "run_s"
