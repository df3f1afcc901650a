"""The scenario file: what to replay (`workload`), against what (`target`), how (`run`), judged by (`slo`).

A scenario is YAML validated by pydantic with unknown keys forbidden. Errors name the file, the line
(from the YAML node marks) and the YAML path of the bad key. Relative trace and model paths resolve
against the scenario file's folder; `run.output` resolves against the current directory. Without a
`target` the run starts the built-in emulator (with the `emulator` settings, typed as
`simulator.emulator.settings.EmulatorSection`) and targets it.

- `schema`: the pydantic models (`Scenario` and its sections) and the JSON Schema made from them.
- `yaml_io`: YAML files read into models with errors placed at their lines (scenario and study files).
- `overrides`: ``--set KEY=VALUE`` overrides of a file's mapping.
- `loader`: `load` and `parse`, a scenario file read, overridden, validated.
- `workloads`: `load_workload`, the workload a scenario replays.
"""

from ..emulator.settings import EmulatorSection
from .loader import load, parse
from .schema import (GenerateOptions, RunSpec, Scenario, SyntheticSpec, TargetSpec, Workers, WorkloadSpec, json_schema,
                     schema_text, write_schema)
from .workloads import load_workload, synthetic_workload
from .yaml_io import MAX_NESTING, FileModel, describe_error, read_mapping, validate

__all__ = [
    "EmulatorSection", "FileModel", "GenerateOptions", "MAX_NESTING", "RunSpec", "Scenario", "SyntheticSpec",
    "TargetSpec", "Workers", "WorkloadSpec", "describe_error", "json_schema", "load", "load_workload", "parse",
    "read_mapping", "schema_text", "synthetic_workload", "validate", "write_schema",
]
