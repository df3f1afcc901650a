"""Studies: the same seeded workload against several server configs, at several loads, repeated; each
config's capacity within the task SLO, its cost per task, whether it changed the model's answers, and
a ranking with its significance (`agentload study STUDY.yaml`).

A study is only a loop over ordinary runs: each (config, load point, repeat) is a result folder that a
live run (`simulator.live.runner.run_scenario`) or a simulation (`simulator.sim.runner.simulate_to_folder`)
writes, so every point can be opened with `agentload report` or `agentload compare`. The modules:

- `schema`: the study file (pydantic; errors name the file, the line and the field).
- `configs`: a base config and its variants resolved into what each one runs (a launched server, an
  existing URL, the built-in emulator, or a twin profile with overlays); `space`: a grid of profile
  settings expanded into twin configs.
- `backends`: a config as something that runs points (starts and stops its server).
- `load`: load points (task arrival rate, `rate_scale`, `max_in_flight`) applied to a workload.
- `points`: one point run into its folder, kept across restarts, marked failed when it fails.
- `figures`: what a point measured, read back from its folder.
- `capacity`: the highest arrival rate within the SLOs, by bracketing and bisection, with its CI.
- `cost`, `quality`, `gpu`: $ per task both ways; probes compared with the base config; NVML figures.
- `ranking`: the objective per config and bootstrap significance of the differences.
- `runner`: the study from start to end; `result`: study.json and the terminal table.

The study folder::

    study.json            the result (below), rewritten after every config
    study-key.json        fingerprint of the study's definition (a restart must match it)
    servers/NAME.log      each launched server's log (NAME.2.log after a restart, ...)
    quality/NAME.json     the probe outputs of each live config
    calibration/          the twin profile calibrated on the base config's server (`twin.calibrate`)
    points/NAME/AXIS-VALUE/rK/        one ordinary result folder per (config, load, repeat), with
                                      study-point.json (status, error, timings) beside the records
    points/NAME/reference/r0/         the fixed-shape reference run (`reference`)
    twin/NAME/...                     the same points on the twin (`twin`, `space`)

study.json (``agentload_study: 1``; numbers are plain JSON numbers, null when not measured)::

    {
      "agentload_study": 1,
      "name": str, "description": str | null, "study_file": str, "folder": str,
      "started_at": ISO time, "finished_at": ISO time | null, "complete": bool,
      "workload": {"source": str, "tasks": int, "calls": int, "subtasks": int,
                   "base_rate_per_s": float | null},
      "slo": {...the Slo as in a scenario: ttft_ms, tpot_ms, task_s...},
      "axis": "rate" | "rate_scale" | "max_in_flight" | null,
      "axis_unit": "tasks/s" | "x" | "tasks in flight" | null,
      "objective": "goodput" | "p95_task" | "cost",
      "confidence": float,
      "cost": {"gpu_hour": float, "gpus": int, "api": {"input": float, "cached_input": float,
               "output": float}} | null,            # $ per GPU-hour; $ per million tokens
      "base": str,                                  # name of the base config
      "configs": [
        {
          "name": str, "kind": "server" | "vllm" | "url" | "emulator" | "twin",
          "is_base": bool, "differs_by": str,       # what this config changes from the base, in words
          "status": "ok" | "failed" | "partial", "error": str | null,
          "server": {"log": str, "startup_s": float | null, "starts": int, "url": str | null} | null,
          "points": [                               # every point run, in the order run
            {"load": float | null, "repeat": int, "seed": int, "source": "sweep" | "capacity" | "reference",
             "folder": str, "status": "ok" | "failed", "error": str | null,
             "offered_rate_per_s": float | null, "slo_met": bool | null,
             "throughput_tasks_per_hour": float, "goodput_tasks_per_hour": float | null,
             "output_tokens_per_s": float, "task_p50_s": float, "task_p95_s": float,
             "ttft_p95_ms": float, "tasks_completed": int, "tasks_failed": int,
             "sustained_tasks_per_hour": float, "requests_per_s": float, "busy_fraction": float | null,
             "growth": float | null, "growth_over_run_s": float | null, "growing": bool,
             "growth_baseline": float | null,
             "tokens": {"tasks": int, "input": int, "cached": int, "output": int},
             "cost_self_hosted_per_task": float | null, "cost_api_per_task": float | null,
             "utilisation": float | null, "gpu": {...gpu figures...} | null,
             "run_s": float, "overhead_s": float}
          ],
          "sweep": [                                # the sweep's points, repeats pooled
            {"load": float, "repeats": int, "ok": int, "slo_met_share": float | null,
             "throughput_tasks_per_hour": float, "run_throughput_tasks_per_hour": float,
             "goodput_tasks_per_hour": float | null,
             "output_tokens_per_s": float, "task_p50_s": float, "task_p95_s": float, "ttft_p95_ms": float}
          ],
          "at_load": float | null,                  # the load the figures below are taken at
          "throughput_tasks_per_hour": float | null, "run_throughput_tasks_per_hour": float | null,
          "goodput_tasks_per_hour": float | null, "output_tokens_per_s": float | null,
          "task_p50_s": float | null, "task_p95_s": float | null, "ttft_p95_ms": float | null,
          "capacity": {"rate_per_s": float, "per_min": float, "per_hour": float,
                       "ci_per_s": [lo, hi], "ci_per_min": [lo, hi], "confidence": float,
                       "status": "ok" | "imprecise" | "partial" | "below_range" | "above_range" | "failed",
                       "at_least_per_s": float | null, "at_most_per_s": float | null,
                       "repeats": [{"repeat": int, "low": float | null, "high": float | null,
                                    "estimate": float | null, "status": str,
                                    "probes": [{"rate": float, "met": bool | null}]}]} | null,
          "cost": {"self_hosted_per_task": float | null, "api_per_task": float | null,
                   "at_rate_per_s": float | null, "tasks_per_hour": float | null,
                   "utilisation": float | null, "utilisation_source": str,
                   "joules_per_task": float | null} | null,
          "quality": {"status": "base" | "same" | "flagged" | "n/a" | "failed",
                      "reason": "outputs" | "logprobs" | null, "probes": int,
                      "identical_share": float | null, "mean_common_prefix_tokens": float | null,
                      "mean_abs_logprob_delta": float | null, "note": str | null} | null,
          "gpu": {"available": bool, "note": str | null, "memory_used_max_bytes": float | null,
                  "utilisation_mean_perc": float | null, "energy_j": float | null,
                  "joules_per_task": float | null},
          "reference": {"label": str, "output_tokens_per_s": float, "requests_per_s": float,
                        "folder": str} | null,
          "objective": {"value": float | null, "ci": [lo, hi] | null, "unit": str},
          "rank": int | null,
          "twin": {"predicted_value": float | null, "predicted_rank": int | null, "profile": str} | null
        }
      ],
      "ranking": {"objective": str, "unit": str, "better": "higher" | "lower", "order": [str],
                  "comparisons": [{"better": str, "worse": str, "difference": float,
                                   "ci": [lo, hi] | null, "significant": bool, "verdict": str}]},
      "twin_prediction": {"profile": str, "calibrated": bool, "configs": [str],
                          "predicted_order": [str], "measured_order": [str], "same_order": bool,
                          "note": str | null} | null,
      "space": {"grid": {key: [values]}, "top_k": int, "profile": str,
                "candidates": [{"name": str, "settings": {key: value}, "predicted_value": float | null,
                                "predicted_rank": int}],
                "live": [{"name": str, "predicted_rank": int, "measured_rank": int | null}]} | null,
      "overhead": {"points": int, "mean_s": float, "max_s": float},
      "failed_points": [{"config": str, "load": float | null, "repeat": int, "source": str,
                         "error": str, "folder": str}]
    }

Figures per point come from the point's summary.json and records: a point's "throughput_tasks_per_hour"
and "goodput_tasks_per_hour" are its summary's (completed top-level tasks, and those within the task
SLO's per-item bound, per hour of the run's window); "sustained_tasks_per_hour" (and a config's
"throughput_tasks_per_hour") is the offered rate times the share completed at a point that held the SLO,
the run's throughput otherwise. A capacity's CI combines the spread of the repeats' estimates (Student t
at `confidence`) with the bisection's last bracket. docs/study.md says the same for users.
"""

STUDY_VERSION = 1
"""The `agentload_study` number written in study.json."""
