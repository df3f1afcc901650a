"""Bayesian search of a config space on the twin (`space.method: tpe`), with Optuna's TPE sampler.

The search asks the sampler for `space.batch` candidates at a time; the runner evaluates them on the
twin (each a twin config of the study, with its points and its capacity search, `evaluate`), and the
search tells the sampler each one's objective values. It stops once `space.budget` candidates have
been simulated. A candidate proposed again is told the values it had (the twin is deterministic), and
one the server would not start (`simulator.study.feasible`) is told as infeasible (an Optuna
constraint, from which the sampler steers away) without a simulation: neither costs any budget. A
sampler that proposes nothing new for `TRIALS_PER_EVALUATION` x budget trials, or a space of choices
all of which were tried, ends the search early.

The study folder is the one source of truth: `twin/search.jsonl` lists every trial's settings in the
order they were asked (written before each is evaluated). A study started again evaluates those first,
their finished points read back from their folders rather than simulated, and gives them to a new
Optuna study as finished trials (`optuna.trial.create_trial`), then asks on. Each trial's sampler is
seeded from the space's `seed` and the trial's number, so a study resumed asks what it would have asked
had it not stopped.
"""

from __future__ import annotations

import itertools
import json
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence

import numpy as np

from ..errors import InputError
from .feasible import Infeasible
from .ranking import HIGHER_IS_BETTER
from .schema import SettingRange, SpaceSpec, StudySpec
from .space import Candidate, candidate_of
from . import settings as space_settings

INSTALL_HINT = "pip install 'agentload[search]'"
LOG_FILE = "twin/search.jsonl"
"""The search's trials, in the study folder."""
TRIALS_PER_EVALUATION = 20
"""Trials the search may ask per unit of budget: a sampler that keeps proposing candidates already tried
(or that cannot run) ends the search at budget x this many trials."""


def optuna_module(file: Optional[str] = None, line: Optional[int] = None) -> Any:
    """Optuna, imported when a search needs it; an InputError saying how to install it when it is not
    (at `file` and `line`, where the study asks for it)."""
    try:
        import optuna  # noqa: PLC0415 - an optional dependency, only for space.method tpe
    except ImportError:
        raise InputError(f"space.method tpe needs Optuna, which is not installed: {INSTALL_HINT}",
                         file=file, line=line, path="space.method") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def objectives_of(study: StudySpec) -> list[str]:
    """What the space is searched for: `space.objectives`, else the study's `objective`."""
    space = study.space
    return list(space.objectives) if space is not None and space.objectives else [study.objective]


def check(study: StudySpec) -> None:
    """What the space asks before the study starts: Optuna for a search, and each of its objectives
    measurable by the study (a cost needs cost.gpu_hour, a p95 task time a sweep: `load`). InputError
    naming the study file, line and field otherwise."""
    space = study.space
    if space is not None and space.method == "tpe":
        optuna_module(study.source, study.line(["space", "method"]))
    if space is None or not space.objectives:
        return
    at = ["space", "objectives"]
    for objective in space.objectives:
        if objective == "cost" and (study.cost is None or study.cost.gpu_hour is None):
            raise InputError("objective cost needs cost.gpu_hour", file=study.source, line=study.line(at),
                             path="space.objectives")
        if objective == "p95_task" and study.load is None:
            raise InputError("objective p95_task is taken at a sweep point: give `load`", file=study.source,
                             line=study.line(at), path="space.objectives")


@dataclass(frozen=True)
class Outcome:
    """What evaluating a candidate gave."""

    values: Optional[tuple[float, ...]] = None
    """Its objective values in the search's order (None: infeasible, or a value missing: points failed)."""
    infeasible: Optional[Infeasible] = None

    @property
    def simulated(self) -> bool:
        """Whether the candidate ran on the twin (what the budget counts)."""
        return self.infeasible is None


# --- the sampler's view of the space ----------------------------------------------------------------


def distribution(key: str, values: Any, optuna: Any) -> Any:
    """The Optuna distribution of one setting: its choices, or its range as the profile field's kind."""
    d = optuna.distributions
    if isinstance(values, list):
        return d.CategoricalDistribution(values)
    assert isinstance(values, SettingRange)
    if space_settings.number_kind(key) == "int":
        return d.IntDistribution(int(values.low), int(values.high), log=values.log, step=int(values.step or 1))
    return d.FloatDistribution(values.low, values.high, log=values.log, step=values.step)


def snapped(values: Any, value: Any) -> Any:
    """A proposed value as the settings hold it: a whole number as an int, a stepped real number exactly
    `low + k x step` (the grid's own value, whatever rounding the sampler did)."""
    if isinstance(values, list):
        return value
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    if values.step is not None:
        return values.low + round((value - values.low) / values.step) * values.step
    return float(value)


def grid_of(space: SpaceSpec) -> Optional[dict[str, list[Any]]]:
    """Every value of every setting when each is a list or a stepped range (whole-number ranges step by
    1), in order; None when a setting is continuous."""
    out: dict[str, list[Any]] = {}
    for key, values in (space.settings or {}).items():
        if isinstance(values, list):
            out[key] = list(values)
            continue
        whole = space_settings.number_kind(key) == "int"
        step = values.step if values.step is not None else (1 if whole else None)
        if step is None:
            return None
        count = round((values.high - values.low) / step) + 1
        out[key] = [int(values.low + k * step) if whole else values.low + k * step for k in range(count)]
    return out


def space_size(space: SpaceSpec) -> Optional[int]:
    """The number of distinct candidates (None: a continuous setting makes them endless)."""
    grid = grid_of(space)
    return None if grid is None else math.prod(len(v) for v in grid.values())


class Sampler:
    """Optuna's TPE sampler over the space's settings, one trial at a time or a batch."""

    def __init__(self, space: SpaceSpec, objectives: Sequence[str]) -> None:
        self.optuna = optuna_module()
        assert space.settings is not None
        self.space = space
        self.settings = space.settings
        self.distributions = {key: distribution(key, values, self.optuna) for key, values in self.settings.items()}
        self.higher = [HIGHER_IS_BETTER[o] for o in objectives]
        self.study = self.optuna.create_study(directions=["maximize" if h else "minimize" for h in self.higher],
                                              sampler=self._sampler(0))

    def _sampler(self, number: int) -> Any:
        """Trial `number`'s sampler, seeded from the space's seed and the number (module doc)."""
        seed = int(np.random.SeedSequence([self.space.seed, number]).generate_state(1)[0])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", self.optuna.exceptions.ExperimentalWarning)
            return self.optuna.samplers.TPESampler(seed=seed, multivariate=True, constant_liar=self.space.batch > 1)

    def ask(self, n: int) -> list[tuple[Any, Candidate]]:
        """`n` new trials and their candidates."""
        out = []
        for _ in range(n):
            self.study.sampler = self._sampler(len(self.study.trials))
            trial = self.study.ask(self.distributions)
            settings = {key: snapped(self.settings[key], trial.params[key]) for key in self.settings}
            out.append((trial, candidate_of(settings)))
        return out

    def tell(self, trial: Any, outcome: Outcome) -> None:
        """A trial's outcome: its values, infeasible (a constraint above 0), or failed (no value)."""
        if outcome.infeasible is not None:
            trial.set_constraint("memory", outcome.infeasible.violation)
            self.study.tell(trial, self._worst())
        elif outcome.values is None:
            self.study.tell(trial, state=self.optuna.trial.TrialState.FAIL)
        else:
            self.study.tell(trial, list(outcome.values))

    def add(self, candidate: Candidate, outcome: Outcome) -> None:
        """A trial of an earlier run of the study, finished: added to the history as it ended."""
        params = {key: candidate.settings[key] for key in self.settings}
        frozen = self.optuna.trial
        if outcome.infeasible is not None:
            trial = frozen.create_trial(params=params, distributions=self.distributions, values=self._worst(),
                                        constraints={"memory": outcome.infeasible.violation})
        elif outcome.values is None:
            trial = frozen.create_trial(params=params, distributions=self.distributions,
                                        state=frozen.TrialState.FAIL)
        else:
            trial = frozen.create_trial(params=params, distributions=self.distributions, values=list(outcome.values))
        self.study.add_trial(trial)

    def _worst(self) -> list[float]:
        """Values an infeasible trial is told (the sampler ranks it by its constraint, not by them)."""
        return [-math.inf if h else math.inf for h in self.higher]


# --- the search -----------------------------------------------------------------------------------


Evaluate = Callable[[list[Candidate]], list[Outcome]]
"""Runs candidates (each once, new to the search) and gives their outcomes, in order."""


def run(space: SpaceSpec, objectives: Sequence[str], evaluate: Evaluate, folder: Path,
        asked: Callable[[Candidate], None] = lambda candidate: None) -> None:
    """Search `space` (module doc), the trials' log in `folder`; `asked(candidate)` for every trial."""
    assert space.budget is not None
    sampler = Sampler(space, objectives)
    log = folder / LOG_FILE
    known: dict[str, Outcome] = {}
    size = space_size(space)

    def settle(batch: list[Candidate]) -> list[Outcome]:
        fresh = list({c.name: c for c in batch if c.name not in known}.values())
        for candidate, outcome in zip(fresh, evaluate(fresh)):
            known[candidate.name] = outcome
        return [known[c.name] for c in batch]

    def simulated() -> int:
        return sum(outcome.simulated for outcome in known.values())

    history = read_log(log, space)
    for batch in _chunks(history, space.batch):
        for candidate in batch:
            asked(candidate)
        for candidate, outcome in zip(batch, settle(batch)):
            sampler.add(candidate, outcome)
    trials = len(history)
    while (simulated() < space.budget and trials < space.budget * TRIALS_PER_EVALUATION
           and (size is None or len(known) < size)):
        batch = sampler.ask(min(space.batch, space.budget - simulated()))
        _append(log, trials, [candidate for _, candidate in batch])
        trials += len(batch)
        for _, candidate in batch:
            asked(candidate)
        for (trial, _), outcome in zip(batch, settle([candidate for _, candidate in batch])):
            sampler.tell(trial, outcome)


def read_log(path: Path, space: SpaceSpec) -> list[Candidate]:
    """The trials a run of this study asked before, in order (none without a log); a last line cut short
    by a stop is dropped from the file (the trials after it are asked again)."""
    if not path.is_file():
        return []
    out = []
    keys = set(space.settings or {})
    lines = path.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines):
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            if number < len(lines) - 1:
                raise InputError("the search's log has a line that is no JSON: give another folder with -o",
                                 file=str(path), line=number + 1) from None
            path.write_text("".join(f"{kept}\n" for kept in lines[:number]), encoding="utf-8")
            break
        settings = entry.get("settings") if isinstance(entry, dict) else None
        if not isinstance(settings, dict) or set(settings) != keys or entry.get("trial") != number:
            raise InputError("the search's log does not match the study's space: give another folder with -o",
                             file=str(path), line=number + 1)
        out.append(candidate_of({key: settings[key] for key in space.settings or {}}))
    return out


def _append(path: Path, first: int, candidates: list[Candidate]) -> None:
    """Trials numbered from `first` added to the log, flushed before they are evaluated."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as out:
        for number, candidate in enumerate(candidates, first):
            out.write(json.dumps({"trial": number, "settings": candidate.settings}) + "\n")


def _chunks(items: list[Candidate], size: int) -> Iterable[list[Candidate]]:
    it = iter(items)
    while chunk := list(itertools.islice(it, size)):
        yield chunk


# --- what the search found --------------------------------------------------------------------------


def pareto_front(values: dict[str, Sequence[Optional[float]]], objectives: Sequence[str]) -> list[str]:
    """The names no other name beats: at least as good in every objective and better in one (names
    with a value missing left out), in the given order."""
    names = [n for n, v in values.items() if all(x is not None for x in v)]
    if not names:
        return []
    signs = np.array([1.0 if HIGHER_IS_BETTER[o] else -1.0 for o in objectives])
    points = np.array([values[n] for n in names], dtype=float) * signs  # higher is better in every column
    beaten = [bool(np.any(np.all(points >= p, axis=1) & np.any(points > p, axis=1))) for p in points]
    return [n for n, b in zip(names, beaten) if not b]
