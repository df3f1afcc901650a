"""Studies: the same seeded workload against several server configs, at several loads, repeated; each
config's capacity within the task SLO, its cost per task, whether it changed the model's answers, and
a ranking with its significance (`agentload study STUDY.yaml`).

A study is only a loop over ordinary runs: each (config, load point, repeat) is a result folder that a
live run (`simulator.pipeline.live.LiveExecutor`) or a simulation (`simulator.pipeline.twin.TwinExecutor`)
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
- `ranking`: the objective per config and whether the differences are beyond noise (from two repeats).
- `sweep`: `agentload sweep`, two studies (anchors, then rates between them) built from a scenario.
- `runner`: the study from start to end, handing out what it has done as a `state.StudyState`;
  `result`: study.json built from a state alone (`model`: its typed shape); `verdict`: what
  --fail-on-slo exits on.

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

study.json is the typed model `simulator.study.model.Study`: every figure is defined there, once, and
built by `simulator.study.result.build`; the terminal table and the report read the same model.
"""
