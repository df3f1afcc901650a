"""Records every step of a vLLM engine, for benchmarks/engine_steps.py (not part of agentload).

Put this folder on the server's PYTHONPATH and name a file in ``AGENTLOAD_STEP_LOG``: when vLLM's
``vllm.v1.engine.core`` is imported, ``EngineCore.step`` is wrapped so that each step that scheduled
tokens appends one line to ``<file>.<pid>``:

    start duration thread_cpu thread_sys minor_faults scheduled...

times in seconds (``start`` is wall-clock time), the CPU and system time the engine thread used during
the step and the page faults it took, then one ``tokens:computed`` pair per scheduled request: the tokens
it computes this step and the tokens it had computed before; at a request's first step the pair ends in
``@arrival``, the wall-clock time the API server received it. Written for vLLM 0.32's synchronous step
(``EngineCore.step``, what the CPU build runs); another version may need another hook.
"""

import importlib.abc
import importlib.util
import os
import resource
import sys
import time

LOG = os.environ.get("AGENTLOAD_STEP_LOG")
MODULE = "vllm.v1.engine.core"


def _wrap(module) -> None:
    core = module.EngineCore
    step = core.step
    out = open(f"{LOG}.{os.getpid()}", "a", buffering=1)

    def timed_step(self):
        scheduler = self.scheduler
        planned = []
        schedule = scheduler.schedule

        def recorded_schedule(*args, **kwargs):
            plan = schedule(*args, **kwargs)
            planned.append(plan)
            return plan

        scheduler.schedule = recorded_schedule
        before = resource.getrusage(resource.RUSAGE_THREAD)
        start = time.time()
        try:
            return step(self)
        finally:
            end = time.time()
            after = resource.getrusage(resource.RUSAGE_THREAD)
            del scheduler.schedule
            if planned and planned[0].total_num_scheduled_tokens:
                _write(out, planned[0], scheduler.requests, start, end, before, after)

    core.step = timed_step


def _write(out, plan, requests, start, end, before, after) -> None:
    computed = {req.req_id: req.num_computed_tokens for req in plan.scheduled_new_reqs}
    cached = plan.scheduled_cached_reqs
    computed.update(zip(cached.req_ids, cached.num_computed_tokens))
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    # a request scheduled for the first time also gives when the API server received it
    arrived = {req.req_id: f"@{requests[req.req_id].arrival_time:.6f}" for req in plan.scheduled_new_reqs
               if req.req_id in requests}
    scheduled = " ".join(f"{n}:{computed.get(req_id, 0)}{arrived.get(req_id, '')}"
                         for req_id, n in plan.num_scheduled_tokens.items())
    out.write(f"{start:.6f} {end - start:.6f} {cpu:.6f} {after.ru_stime - before.ru_stime:.6f} "
              f"{after.ru_minflt - before.ru_minflt} {scheduled}\n")


class _Hook(importlib.abc.MetaPathFinder):
    """Finds vLLM's engine-core module as usual and wraps its step once it has run."""

    def find_spec(self, name, path, target=None):
        if name != MODULE:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            _wrap(module)

        spec.loader.exec_module = exec_module
        return spec


if LOG:
    sys.meta_path.insert(0, _Hook())
