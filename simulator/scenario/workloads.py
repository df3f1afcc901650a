"""The workload a scenario replays: a trace read, a workload model generated from, or a fixed-shape
synthetic workload; then its transforms, stagger and task limit."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Optional

from ..errors import InputError
from ..transforms import apply as apply_transforms
from ..workload import Call, Provenance, Task, Workload
from .schema import GenerateOptions, Scenario, SyntheticSpec


def load_workload(scenario: Scenario) -> Workload:
    """The workload the scenario replays: read or generated, transformed, cut to `run.max_tasks`."""
    spec = scenario.workload
    where = scenario.source
    if spec.trace is not None:
        from ..traces import load as load_traces  # noqa: PLC0415 - the importers load only for a trace

        paths = [scenario.resolve(p) for p in spec.trace_paths()]
        workload = load_traces(paths, spec.format, spec.on_error, spec.assume_append_only,
                               format_option=_format_option(where))
    elif spec.synthetic is not None:
        workload = synthetic_workload(spec.synthetic)
    else:
        workload = _generate(scenario, scenario.resolve(spec.model))
    if spec.transforms is not None and not spec.transforms.is_identity():
        try:
            workload = apply_transforms(workload, spec.transforms, scenario.run.seed)
        except InputError as exc:
            exc.file = exc.file or where
            exc.path = exc.path or "workload.transforms"
            raise
    if spec.stagger is not None:
        ordered = sorted(workload.tasks, key=lambda t: t.arrival)
        workload = Workload(tuple(dataclasses.replace(t, arrival=i * spec.stagger) for i, t in enumerate(ordered)),
                            workload.provenance)
    if scenario.run.max_tasks is not None:
        tasks = sorted(workload.tasks, key=lambda t: t.arrival)[: scenario.run.max_tasks]
        workload = Workload(tuple(tasks), workload.provenance)
    if not workload.tasks:
        raise InputError("the workload has no tasks", file=where, path="workload")
    return workload


def _format_option(source: Optional[str]) -> str:
    """How the user of a scenario from `source` forces a trace format: its file's `workload.format`, or
    for a scenario made without a file (from command-line flags) the --format flag."""
    if source and Path(source).is_file():
        return f"workload.format in {source}"
    return "--format"


def _generate(scenario: Scenario, model_path: Path) -> Workload:
    """Generate tasks from a workload model file (simulator.model)."""
    try:
        from ..model.generate import generate  # noqa: PLC0415 - only workloads generated from a model
        from ..model.schema import load_model
    except ImportError:
        raise InputError("workload models are not available in this build", file=scenario.source,
                         path="workload.model") from None
    options = scenario.workload.generate or GenerateOptions()
    seed = options.seed if options.seed is not None else scenario.run.seed
    tasks, duration = options.tasks, options.duration
    if tasks is None and duration is None:
        tasks, duration = (None, scenario.run.duration) if scenario.run.duration else (scenario.run.max_tasks, None)
    if tasks is None and duration is None:
        raise InputError("say how much to generate: workload.generate.tasks or .duration (or run.duration)",
                         file=scenario.source, path="workload.generate")
    return generate(load_model(model_path), tasks=tasks, duration=duration, seed=seed, rate=options.rate,
                    burstiness=options.burstiness, source=str(model_path))


def synthetic_workload(spec: SyntheticSpec) -> Workload:
    """The fixed-shape workload of `spec`: one task per stream, all arriving at 0, the calls spread
    evenly over them back to back; calls carry no hash ids, so every prompt is unique."""

    call = Call(input_tokens=spec.input_tokens, output_tokens=spec.output_tokens)
    total = spec.calls if spec.calls is not None else 8 * spec.concurrency
    streams = min(spec.concurrency, total)
    per, extra = divmod(total, streams)
    tasks = tuple(Task(id=f"stream-{i}", calls=(call,) * (per + (1 if i < extra else 0))) for i in range(streams))
    note = Provenance(source="synthetic", format="synthetic", options=spec.model_dump())
    return Workload(tasks, (note,))
