"""The target of a live run: the scenario's server (its credentials checked, said before the run when
given twice) or the built-in emulator started for the run, and the HTTP client aimed at it."""

from __future__ import annotations

import contextlib
import os
import time
from typing import TYPE_CHECKING, Any, AsyncIterator, Optional
from urllib.parse import urlsplit

from ..errors import InputError
from ..scenario import Scenario
from .prompts import PromptBuilder

if TYPE_CHECKING:
    from .client import Target


def emulator_note(scenario: Scenario) -> dict[str, Any]:
    """run.json's word on the built-in emulator: ``emulator`` (whether the run started it) and, when it
    did, ``emulator_timing``, what timing it ran (`simulator.emulator.settings.timing_record`)."""
    if scenario.target is not None:
        return {"emulator": False}
    from ..emulator.settings import timing_record

    return {"emulator": True, "emulator_timing": timing_record(scenario.emulator)}


@contextlib.asynccontextmanager
async def open_target(scenario: Scenario, **more: Any) -> AsyncIterator[Any]:
    """The client's Target: the scenario's (checked: its API key set, no credentials given twice), or
    the built-in emulator started for this run; `more` are further `Target` settings (a fleet's session
    and replica headers)."""
    from .client import Target

    spec = scenario.target
    if spec is None:
        from ..emulator.server import run_emulator

        emulator = scenario.emulator
        async with run_emulator(emulator.host, emulator.port, settings=emulator) as base_url:
            yield Target(base_url=base_url, vocab_size=emulator.vocab_size, api_key=emulator.api_key, **more)
        return
    api_key = None
    if spec.api_key_env:
        api_key = os.environ.get(spec.api_key_env)
        if api_key is None:
            raise InputError(f"environment variable {spec.api_key_env} is not set", file=scenario.source,
                             path="target.api_key_env", field="api_key_env")
    _check_credentials(scenario, api_key)
    yield Target(api_key=api_key, **{**spec.client_fields(), **more})


def _check_credentials(scenario: Scenario, api_key: Optional[str]) -> None:
    """Credentials given in two places (the URL's user:password, an API key, an Authorization header)
    would reach the server as two Authorization headers: a configuration error, said before the run."""
    spec = scenario.target
    assert spec is not None
    given = []
    if urlsplit(spec.base_url).username is not None or "@" in urlsplit(spec.base_url).netloc:
        given.append("credentials in target.base_url")
    if api_key is not None:
        given.append(f"an API key (target.api_key_env: {spec.api_key_env})")
    if any(name.lower() == "authorization" for name in spec.headers):
        given.append("an Authorization header in target.headers")
    if len(given) > 1:
        raise InputError(f"credentials given twice: {' and '.join(given)}; keep one", file=scenario.source,
                         path="target")


def make_client(target: Target, run: Any) -> Any:
    """The HTTP client of a run (a header the client cannot send is bad input, said before the run)."""
    from .client import Client

    prompts = PromptBuilder(vocab_size=target.vocab_size, share_prefixes=target.share_prefixes, seed=run.seed)
    try:
        return Client(target, time.perf_counter(), prompts)
    except ValueError as exc:
        raise InputError(str(exc), path="target.headers") from None
