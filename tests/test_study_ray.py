"""`agentload study --ray` on a real local Ray cluster (two CPUs): a twin study's points run as Ray
tasks give the same study.json figures, point folders and resume as the study run here; which configs
fan out; without Ray, --ray says how to get it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from simulator.cli import main as cli_main
from simulator.study import fan_out
from simulator.study.configs import Config

ray = pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[1]

STUDY = """\
name: twin-ray
scenario: {scenario}
set: [workload.transforms.gap_cap=0]
slo:
  task_s: {{p50: 1.5}}
configs:
  base: {{name: wide, profile: tiny-vllm-cpu}}
  variants:
    - {{name: narrow, overlay: {{scheduler: {{max_num_seqs: 1}}}}}}
load: {{axis: rate, points: [1, 4]}}
capacity: {{low: 1, high: 4, precision: 0.25, repeats: 1, max_growth: 2.0}}
repeats: 2
reference: {{label: 64/32 x 8, synthetic: {{input_tokens: 64, output_tokens: 32, concurrency: 8, calls: 16}}}}
"""

TIMINGS = {"run_s", "overhead_s", "start_s", "started_at", "finished_at", "overhead", "mean_s", "max_s"}


@pytest.fixture(scope="module")
def cluster():
    """One local Ray cluster for the module; the study finds it connected and leaves it up."""
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    yield
    ray.shutdown()


@pytest.fixture
def study_file(tmp_path) -> Path:
    path = tmp_path / "study.yaml"
    path.write_text(STUDY.format(scenario=ROOT / "scenarios" / "vllm" / "claude-code.yaml"))
    return path


def figures(value):
    """study.json without its wall-clock timings and folder (what differs between two runs)."""
    if isinstance(value, dict):
        return {k: figures(v) for k, v in value.items() if k not in TIMINGS and k not in ("folder", "study_folder")}
    if isinstance(value, list):
        return [figures(v) for v in value]
    return value


def study(args: list[str]) -> tuple[int, dict]:
    code = cli_main(args)
    out = Path(args[args.index("-o") + 1])
    return code, json.loads((out / "study.json").read_text())


def point_files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and p.name != "study.json")


def test_twin_points_on_ray_give_the_same_study(cluster, study_file, tmp_path, monkeypatch):
    here, on_ray = tmp_path / "here", tmp_path / "ray"
    code, plain = study(["study", str(study_file), "-o", str(here)])
    assert code == 0 and plain["complete"]

    fanned: list[str] = []
    real = fan_out.run_jobs

    def spy(jobs):
        fanned.extend(job.result.folder for job in jobs)
        return real(jobs)

    monkeypatch.setattr(fan_out, "run_jobs", spy)
    code, ray_study = study(["study", str(study_file), "-o", str(on_ray), "--ray"])
    assert code == 0 and ray_study["complete"]
    # every config's reference and sweep points went out as Ray tasks (2 loads x 2 repeats + reference)
    assert len(fanned) == 2 * 5 and "points/narrow/rate-4/r1" in fanned
    assert figures(ray_study) == figures(plain)
    assert [p["folder"] for c in ray_study["configs"] for p in c["points"]] == \
        [p["folder"] for c in plain["configs"] for p in c["points"]]
    assert point_files(on_ray) == point_files(here)
    assert ray.is_initialized()  # a cluster the study found connected is left up

    # started again with --ray, the study reads every point back and runs none
    fanned.clear()
    code, again = study(["study", str(study_file), "-o", str(on_ray), "--ray"])
    assert code == 0 and figures(again) == figures(plain)
    assert len(fanned) == 10  # sent out, each read back in its worker
    assert all(p["run_s"] == q["run_s"] for c, d in zip(again["configs"], ray_study["configs"])
               for p, q in zip(c["points"], d["points"]))
    assert point_files(on_ray) == point_files(here)  # nothing set aside


def test_a_point_whose_task_raises_is_failed_and_the_study_goes_on(cluster, study_file, tmp_path, monkeypatch):
    from simulator.study import backends, runner

    class Broken(backends.TwinBackend):  # pickled by value with each job, so it breaks in the worker too
        def run_point(self, scenario, workload, folder):
            raise ValueError("profile went wrong")

    real_backend = runner.StudyRunner.backend
    monkeypatch.setattr(runner.StudyRunner, "backend", lambda self, config: Broken(real_backend(self, config).profile))
    code, result = study(["study", str(study_file), "-o", str(tmp_path / "out"), "--ray", "--set", "capacity=null"])
    assert code == 1 and result["complete"]
    points = [p for c in result["configs"] for p in c["points"]]
    assert len(points) == 10 and all(p["status"] == "failed" for p in points)
    assert points[0]["error"].startswith("config wide, reference point reference, repeat 0: on Ray: ValueError: "
                                         "profile went wrong")


def test_which_configs_fan_out():
    twin = Config(name="t", kind="twin", is_base=True)
    assert fan_out.independent(twin, None)
    assert fan_out.independent(Config(name="e", kind="emulator", is_base=True), None)
    for kind in ("server", "vllm", "url"):  # one server shared by all the config's points
        assert not fan_out.independent(Config(name="s", kind=kind, is_base=True), None)
    assert not fan_out.independent(Config(name="e", kind="emulator", is_base=True), object())


def test_without_ray_installed_ray_says_how_to_get_it(study_file, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)
    code = cli_main(["study", str(study_file), "-o", str(tmp_path / "out"), "--ray"])
    assert code != 0
    assert "pip install 'agentload[ray]'" in capsys.readouterr().err


EMULATOR_STUDY = """\
name: emulator-ray
workload:
  synthetic: {input_tokens: 16, output_tokens: 4, concurrency: 4, calls: 8}
configs:
  base: {name: emu, emulator: {ttft: 0.01, itl: 0.002}}
load: {axis: max_in_flight, points: [1, 2]}
gpu: "off"
"""


def test_emulator_points_run_as_ray_tasks(cluster, tmp_path, monkeypatch):
    path = tmp_path / "emu.yaml"
    path.write_text(EMULATOR_STUDY)
    fanned: list[str] = []
    real = fan_out.run_jobs
    monkeypatch.setattr(fan_out, "run_jobs", lambda jobs: fanned.extend(j.result.folder for j in jobs) or real(jobs))
    code, here = study(["study", str(path), "-o", str(tmp_path / "here")])
    assert code == 0 and fanned == []
    code, on_ray = study(["study", str(path), "-o", str(tmp_path / "ray"), "--ray"])
    assert code == 0 and fanned == ["points/emu/max_in_flight-1/r0", "points/emu/max_in_flight-2/r0"]
    # live timings differ run to run; what ran and what completed do not
    keys = ("folder", "status", "load", "seed", "tasks_completed")
    assert [{k: p.get(k) for k in keys} for p in on_ray["configs"][0]["points"]] == \
        [{k: p.get(k) for k in keys} for p in here["configs"][0]["points"]]
    assert all(p["tasks_completed"] > 0 for p in on_ray["configs"][0]["points"])


SEARCH = """\
name: search-ray
workload:
  synthetic: {input_tokens: 16, output_tokens: 4, concurrency: 40, calls: 40}
  stagger: 0.05
slo:
  task_s: {p50: 0.3}
configs:
  base: {name: base, profile: tiny-vllm-cpu}
load: {axis: rate, points: [20]}
space:
  method: tpe
  settings:
    scheduler.max_num_seqs: {low: 1, high: 8}
    scheduler.max_num_batched_tokens: [256, 512, 2048]
  budget: 4
  batch: 2
  seed: 3
"""


def test_a_search_s_batches_run_on_ray_and_give_the_same_search(cluster, tmp_path, monkeypatch):
    pytest.importorskip("optuna")
    path = tmp_path / "search.yaml"
    path.write_text(SEARCH)
    code, plain = study(["study", str(path), "-o", str(tmp_path / "here")])
    assert code == 0

    from simulator.study.backends import TwinBackend

    here: list[str] = []
    real = TwinBackend.run_point
    monkeypatch.setattr(TwinBackend, "run_point", lambda self, s, w, f: (here.append(str(f)), real(self, s, w, f))[1])
    code, on_ray = study(["study", str(path), "-o", str(tmp_path / "ray"), "--ray"])
    assert code == 0 and figures(on_ray["space"]) == figures(plain["space"])
    # each batch's candidates ran in Ray workers (the patch above is this process's only); here they were read back
    assert not [f for f in here if "/twin/space/" in f]
    assert point_files(tmp_path / "ray") == point_files(tmp_path / "here")
