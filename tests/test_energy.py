"""Energy per task: the profile's power model, the twin's energy over the measurement window and its
attribution to tasks and output tokens, the ``energy`` section in every view (terminal, summary.json,
CSV, HTML, comparison), a live run's NVML power samples, the power model fitted to them, and a study
ranked by joules per task."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import conversations as shared
from simulator.calibration.power import fit_power, intervals_of
from simulator.cli import main as cli_main
from simulator.errors import InputError
from simulator.live.probes import MetricsProbe
from simulator.metrics import results
from simulator.metrics.energy import EnergyFigures, SampledPower, energy_figures, sampled_power
from simulator.metrics.folder import planned_counts
from simulator.metrics.results import Window
from simulator.metrics.server import Sample
from simulator.pipeline.execute import execute
from simulator.pipeline.fleet_twin import FleetTwinExecutor
from simulator.pipeline.plan import RunPlan
from simulator.pipeline.twin import simulate_to_folder
from simulator.report.build import build_report, html
from simulator.scenario.fleet import FleetSpec
from simulator.report.csv_export import write_run
from simulator.report.terminal import render
from simulator.sim.power import EngineTimeline, TwinEnergy, energy_j
from simulator.sim.profile import PowerSettings, ServerProfile, load_profile, preset_names, profile_from_dict
from simulator.sim.twin import TwinStats
from simulator.study.ranking import HIGHER_IS_BETTER, UNITS

ROOT = Path(__file__).resolve().parents[1]
POWER = {"gpus": 2, "idle_w": 100.0, "busy_w": 400.0, "per_token_j": 0.01, "per_step_j": 0.5, "source": "test figures"}


def profile(power: dict | None = POWER) -> ServerProfile:
    data = {"scheduler": {"max_num_seqs": 32, "max_num_batched_tokens": 512, "max_model_len": 4096},
            "kv_cache": {"block_size": 16, "num_blocks": 4000},
            "step_time": {"fixed": 0.01, "per_token": 2e-5, "per_decode_seq": 3e-4, "per_context_token": 1e-7}}
    return profile_from_dict({**data, "power": power} if power is not None else data)


def simulate(tmp_path: Path, prof: ServerProfile, name: str = "sim", **options):
    workload = shared.conversations(5, tasks=30, max_output=120, arrival_span=4.0)
    folder = tmp_path / name
    summary, result = simulate_to_folder(workload, prof, folder, **options)
    return folder, summary, result


# --- the power model --------------------------------------------------------------------------------

def test_power_model_prices_idle_time_busy_time_tokens_and_steps():
    power = PowerSettings(**POWER)
    # 2 GPUs: 100 W each for 10 s, 300 W more each for 4 s busy; 1,000 tokens; 50 steps
    assert energy_j(power, wall_s=10, busy_s=4, tokens=1000, steps=50) == pytest.approx(
        2 * (100 * 10 + 300 * 4) + 0.01 * 1000 + 0.5 * 50)
    # three servers idle three times over; their busy seconds are already summed
    assert energy_j(power, wall_s=10, busy_s=4, servers=3) == pytest.approx(2 * (100 * 30 + 300 * 4))


def test_power_settings_refuse_busy_below_idle_and_stay_out_of_a_profile_without_them():
    with pytest.raises(InputError, match="busy_w 50 is below idle_w 100"):
        profile({"idle_w": 100, "busy_w": 50})
    assert "power" not in profile(None).model_dump(mode="json")  # a dump without power is as before
    assert load_profile("tiny-vllm-cpu").power is None
    # every GB300 preset states its power, with the source of its assumptions
    for name in (n for n in preset_names() if n.startswith("gb300")):
        power = load_profile(name).power
        assert power is not None and power.busy_w == 1400 and "TGP" in power.source


def test_timeline_interpolates_its_counters_between_samples():
    timeline = EngineTimeline()
    timeline.add(10.0, TwinStats(busy_time=4.0, prefill_tokens=600, output_tokens=100, steps=40), 200)
    timeline.add(20.0, TwinStats(busy_time=6.0, prefill_tokens=800, output_tokens=400, steps=60))
    # from 5 s (half the first interval) to 15 s (half the second)
    busy, tokens, steps = timeline.between(5.0, 15.0)
    assert busy == pytest.approx(3.0) and tokens == pytest.approx(1000 - 400) and steps == pytest.approx(30)
    meter = TwinEnergy(PowerSettings(**POWER), timeline)
    assert meter.joules(5.0, 15.0) == pytest.approx(energy_j(meter.power, wall_s=10, busy_s=3, tokens=600, steps=30))
    with pytest.raises(ValueError):
        timeline.add(19.0, TwinStats())


# --- the twin's energy over the window ----------------------------------------------------------------

def test_twin_energy_over_the_whole_run_is_the_power_model_of_its_counters(tmp_path):
    folder, summary, result = simulate(tmp_path, profile())
    stats, energy = result.twin, summary.energy
    assert summary.duration == pytest.approx(result.end)  # the window is the whole run
    expected = energy_j(PowerSettings(**POWER), wall_s=result.end, busy_s=stats.busy_time,
                        tokens=stats.prefill_tokens + stats.output_tokens, steps=stats.steps)
    assert energy.joules == pytest.approx(expected, rel=1e-9)
    assert energy.window_s == summary.duration and energy.mean_power_w == pytest.approx(expected / result.end)
    assert energy.joules_per_task == pytest.approx(expected / summary.tasks.completed)
    assert energy.joules_per_output_token == pytest.approx(expected / summary.total_output_tokens)
    assert energy.source == "twin power model" and energy.assumptions == "test figures"
    # summary.json holds the section as the summary has it; without scraping the end points suffice
    assert json.loads((folder / results.SUMMARY_FILE).read_text())["energy"] == energy.to_dict()
    _, unsampled, _ = simulate(tmp_path, profile(), "unsampled", scrape_interval=None)
    assert unsampled.energy.joules == pytest.approx(expected, rel=1e-9)


def test_twin_energy_covers_the_measurement_window_only(tmp_path):
    _, whole, _ = simulate(tmp_path, profile(), "whole", scrape_interval=0.25)
    _, windowed, _ = simulate(tmp_path, profile(), "windowed", scrape_interval=0.25, window=Window(start=2.0))
    energy = windowed.energy
    assert energy.window_s == windowed.duration < whole.duration
    idle, busy = 2 * POWER["idle_w"], 2 * POWER["busy_w"]
    assert idle * energy.window_s < energy.joules < whole.energy.joules
    assert energy.mean_power_w < busy + 1e4  # no more than every GPU busy, plus the work's terms
    assert energy.joules_per_task == pytest.approx(energy.joules / windowed.tasks.completed)


def test_a_fleet_on_the_twin_draws_every_replicas_idle_power(tmp_path):
    workload = shared.conversations(6, tasks=24, max_output=60, arrival_span=3.0)
    summaries = {}
    for replicas in (1, 3):
        plan = RunPlan(workload=workload, folder=tmp_path / f"fleet{replicas}",
                       planned=planned_counts(workload, Window(), None), scrape_interval=0.5)
        fleet = FleetSpec(replicas=replicas, router={"policy": "round_robin"})
        summaries[replicas], result = execute(plan, FleetTwinExecutor(fleet, profile()))
        stats = result.twin  # the replicas' counters summed
        assert summaries[replicas].energy.joules == pytest.approx(energy_j(
            PowerSettings(**POWER), wall_s=result.end, busy_s=stats.busy_time, servers=replicas,
            tokens=stats.prefill_tokens + stats.output_tokens, steps=stats.steps), rel=1e-9)
    one, three = summaries[1].energy, summaries[3].energy
    assert three.mean_power_w > 3 * 2 * POWER["idle_w"] and three.joules > one.joules  # three replicas' idle power


def test_a_profile_without_power_reports_no_energy_not_zero(tmp_path):
    folder, summary, _ = simulate(tmp_path, profile(None))
    assert summary.energy is None
    assert "energy" not in json.loads((folder / results.SUMMARY_FILE).read_text())
    assert not any("Energy" in str(getattr(part, "title", "")) for part in render(summary))
    written = write_run(folder, tmp_path / "csv")
    assert "energy." not in (tmp_path / "csv" / "summary.csv").read_text()
    assert written


def test_energy_is_shown_the_same_in_terminal_csv_html_and_comparison(tmp_path, capsys, monkeypatch):
    folder, summary, _ = simulate(tmp_path, profile())
    per_task = summary.energy.joules_per_task
    monkeypatch.setenv("COLUMNS", "200")
    assert cli_main(["report", str(folder)]) == 0
    text = capsys.readouterr().out
    shown = f"{per_task:,.0f} J" if per_task >= 100 else f"{per_task:.1f} J"
    assert "joules per completed task" in text and shown in text and "twin power model (test figures)" in text
    write_run(folder, tmp_path / "csv")
    rows = dict(line.split(",", 1) for line in (tmp_path / "csv" / "summary.csv").read_text().splitlines()[1:])
    assert float(rows["energy.joules_per_task"]) == pytest.approx(per_task)
    page = html(build_report([folder]), tmp_path / "report.html").read_text()
    assert "joules per completed task" in page and shown in page
    assert cli_main(["report", str(folder), str(folder)]) == 0
    assert "joules per completed task (J)" in capsys.readouterr().out


# --- live: NVML power samples -------------------------------------------------------------------------

def test_sampled_power_integrates_each_sample_over_the_time_before_it():
    # 100 W until 1 s, 300 W from 1 s to 2 s, 200 W from 2 s to 4 s, held after
    meter = SampledPower([1.0, 2.0, 4.0], [100.0, 300.0, 200.0])
    assert meter.joules(0.0, 4.0) == pytest.approx(100 + 300 + 400)
    assert meter.joules(1.5, 3.0) == pytest.approx(150 + 200)
    assert meter.joules(4.0, 6.0) == pytest.approx(400)
    samples = [Sample(float(t), {"gpu0_power_w": 50.0, "gpu1_power_w": 70.0, "gpu0_util_perc": 3.0}) for t in range(3)]
    assert sampled_power(samples).joules(0.0, 2.0) == pytest.approx(240)  # the GPUs summed
    assert sampled_power([Sample(0.0, {"gpu0_util_perc": 3.0})]) is None  # no power: no meter


def test_the_probe_samples_each_gpus_board_power_beside_its_utilisation():
    class FakeNvml:
        class NVMLError(Exception):
            pass

        @staticmethod
        def nvmlDeviceGetUtilizationRates(handle):
            return type("Util", (), {"gpu": 40 + handle})()

        @staticmethod
        def nvmlDeviceGetMemoryInfo(handle):
            return type("Mem", (), {"used": 1e9})()

        @staticmethod
        def nvmlDeviceGetPowerUsage(handle):
            if handle == 1:
                raise FakeNvml.NVMLError("not supported")
            return 612_500  # milliwatts

    probe = MetricsProbe("http://127.0.0.1:1")
    probe._nvml, probe._gpu_handles = FakeNvml, [0, 1]
    values = probe._gpu_values()
    assert values["gpu0_power_w"] == 612.5 and "gpu1_power_w" not in values  # a GPU without it: left out
    assert values["gpu1_util_perc"] == 41.0 and probe.gpu_note is None


def test_energy_figures_divide_the_windows_joules_by_its_tasks_and_tokens():
    class Meter:
        source, assumptions = "test meter", None
        asked: list[tuple[float, float]] = []

        def joules(self, start: float, end: float) -> float:
            self.asked.append((start, end))
            return 600.0

    figures = energy_figures(Meter(), start=10.0, duration=30.0, tasks_completed=4, output_tokens=300)
    assert Meter.asked == [(10.0, 40.0)]  # the window from its start for the run's duration
    assert figures == EnergyFigures(joules=600.0, window_s=30.0, mean_power_w=20.0, joules_per_task=150.0,
                                    joules_per_output_token=2.0, source="test meter")
    none = energy_figures(Meter(), start=0.0, duration=0.0, tasks_completed=0, output_tokens=0)
    assert none.joules_per_task is None and none.joules_per_output_token is None and none.mean_power_w is None


# --- calibration from NVML samples --------------------------------------------------------------------

def nvml_samples(seed: int, *, gpus: int, idle: float, busy: float, per_token: float, n: int = 300,
                 noise_w: float = 8.0) -> list[dict]:
    """Samples of a server that follows the power model: each one's power, utilisation and token counts
    for the second before it, with noise on the power."""
    rng = np.random.default_rng(seed)
    rows, prompt, cached, out = [], 0.0, 0.0, 0.0
    for i in range(n):
        share = 0.0 if rng.random() < 0.35 else float(rng.uniform(0.2, 1.0))
        computed = share * float(rng.uniform(200, 4000))
        cached += 0.5 * computed
        prompt += 1.5 * computed * 0.7
        out += computed - 1.5 * computed * 0.7 + 0.5 * computed
        watts = gpus * idle + gpus * (busy - idle) * share + per_token * computed
        row = {"t": float(i), "prompt_tokens": prompt, "prompt_tokens_cached": cached, "generation_tokens": out}
        for g in range(gpus):
            row[f"gpu{g}_power_w"] = watts / gpus + float(rng.normal(0, noise_w))
            row[f"gpu{g}_util_perc"] = 100.0 * share
        rows.append(row)
    return rows


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_power_fit_recovers_a_known_model(seed):
    fit = fit_power(intervals_of(nvml_samples(seed, gpus=2, idle=180.0, busy=1100.0, per_token=0.03)))
    power = fit.power
    assert power.gpus == 2 and fit.intervals == 299
    assert power.idle_w == pytest.approx(180.0, rel=0.02) and power.busy_w == pytest.approx(1100.0, rel=0.02)
    assert power.per_token_j == pytest.approx(0.03, rel=0.1)
    assert fit.rms_w == pytest.approx(8.0 * np.sqrt(2), rel=0.2)  # the noise it was given, two GPUs summed
    assert all(abs(v - t) < 4 * fit.stderr[k] for k, v, t in (("idle_w", power.idle_w, 180.0),
                                                                ("busy_w", power.busy_w, 1100.0)))


def test_power_fit_says_what_its_samples_lack():
    with pytest.raises(InputError, match="no GPU power samples"):
        intervals_of([{"t": 0.0, "gpu0_util_perc": 1.0}])
    steady = [dict(row, gpu0_util_perc=90.0) for row in nvml_samples(0, gpus=1, idle=100, busy=500, per_token=0)]
    with pytest.raises(InputError, match="idle and busy stretches"):
        fit_power(intervals_of(steady))
    with pytest.raises(InputError, match="10 or more"):
        fit_power(intervals_of(nvml_samples(0, gpus=1, idle=100, busy=500, per_token=0, n=5)))


def test_calibrate_power_from_run_folders_writes_the_profile_with_its_power(tmp_path, capsys):
    for seed in (3, 4):
        folder = tmp_path / f"run{seed}"
        folder.mkdir()
        rows = nvml_samples(seed, gpus=1, idle=150.0, busy=700.0, per_token=0.02)
        (folder / "server_metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "fitted.yaml"
    assert cli_main(["calibrate", "-p", "tiny-vllm-cpu", "--power-from", str(tmp_path / "run3"),
                     str(tmp_path / "run4"), "-o", str(out)]) == 0
    assert "598 intervals" in capsys.readouterr().out
    fitted = load_profile(out)
    assert fitted.power.idle_w == pytest.approx(150.0, rel=0.02) and fitted.power.busy_w == pytest.approx(700.0, rel=0.02)
    assert fitted.step_time == load_profile("tiny-vllm-cpu").step_time  # only the power model changes


# --- studies --------------------------------------------------------------------------------------------

ENERGY_STUDY = """\
name: energy
scenario: {scenario}
set: [workload.transforms.gap_cap=0, run.max_tasks=3]
objective: energy
configs:
  base: {{name: frugal, profile: tiny-vllm-cpu, overlay: {{power: {{idle_w: 50, busy_w: 200}}}}}}
  variants:
    - {{name: hungry, overlay: {{power: {{idle_w: 50, busy_w: 500}}}}}}
    - {{name: unmetered, profile: tiny-vllm-cpu}}
slo:
  task_s: {{p50: 5}}
load: {{axis: rate, points: [2]}}
capacity: {{low: 1, high: 8, precision: 0.5, repeats: 1}}
"""


def test_objective_energy_ranks_by_joules_per_task_lower_first(tmp_path, capsys, monkeypatch):
    assert UNITS["energy"] == "J/task" and HIGHER_IS_BETTER["energy"] is False
    path = tmp_path / "study.yaml"
    path.write_text(ENERGY_STUDY.format(scenario=ROOT / "scenarios" / "vllm" / "claude-code.yaml"))
    monkeypatch.setenv("COLUMNS", "250")
    assert cli_main(["study", str(path), "-o", str(tmp_path / "out"), "--csv", str(tmp_path / "csv")]) == 0
    study = json.loads((tmp_path / "out" / "study.json").read_text())
    configs = {c["name"]: c for c in study["configs"]}
    frugal, hungry, unmetered = configs["frugal"], configs["hungry"], configs["unmetered"]
    # the same twin, so the same busy time: the config that draws more per busy second ranks below
    assert study["ranking"]["order"] == ["frugal", "hungry", "unmetered"]  # unranked last
    assert (frugal["rank"], hungry["rank"], unmetered["rank"]) == (1, 2, None)
    for c in (frugal, hungry):
        # at the capacity search's highest probe that held, as the $ per task
        low = c["capacity"]["repeats"][0]["low"]
        point = next(p for p in c["points"] if p["source"] == "capacity" and p["load"] == low)
        assert point["verdict"] == "held"
        # three tasks test no rate above 4/s: past the search's range, a higher load would spread the idle
        # power over more tasks, so the joules there are at most this
        assert c["capacity"]["status"] == "above_range" and c["objective"]["bound"] == "at_most"
        assert c["objective"]["value"] == pytest.approx(point["joules_per_task"])
        assert c["objective"]["unit"] == "J/task" and c["cost"]["joules_per_task"] == pytest.approx(point["joules_per_task"])
        assert c["cost"]["energy_source"] == "twin power model"
    assert frugal["objective"]["value"] < hungry["objective"]["value"]
    # a config without a power model has no energy, not zero, anywhere
    assert unmetered["cost"]["joules_per_task"] is None and "energy_source" not in unmetered["cost"]
    assert all("joules_per_task" not in p for p in unmetered["points"])
    text = capsys.readouterr().out
    assert "J/task" in text and "joules per task" in text
    assert "cost.joules_per_task" in (tmp_path / "csv" / "study_configs.csv").read_text()
