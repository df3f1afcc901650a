"""The built-in OpenAI-compatible emulator: a server that behaves like vLLM on the wire, without a model.

It serves ``GET /v1/models``, ``GET /health``, ``POST /v1/completions``, ``POST /v1/chat/completions``
and ``POST /tokenize``, streaming (SSE) or not, with ``usage`` (including
``prompt_tokens_details.cached_tokens`` from a prefix cache on token blocks) and errors in vLLM's JSON
shape and words (as of vLLM 0.32). It always generates exactly ``max_tokens`` tokens (capped by the
context), as vLLM does with ``ignore_eos``.

The HTTP side is apart from the timing models, which decide when tokens come out:

- `settings`: `EmulatorSettings`, what a run or ``agentload serve-emulator`` asks for.
- `faults`: the injectable faults (``X-Agentload-Fault`` header, or drawn at random from a seed).
- `timing`: the `TimingModel` interface with its declared capabilities, the one-loop base
  `LoopTiming`, and `FixedTiming` and `BatchTiming`.
- `twin_timing`: `TwinTiming`, the SimPy server twin of a profile run in wall-clock time.
- `prefix_cache`: block hashes of token prefixes and the server's LRU prefix cache.
- `api`: reading and checking request bodies as vLLM does, and its error responses.
- `stream`: the writer of one SSE response's token chunks.
- `server`: the aiohttp server `Emulator` and `run_emulator`.
- `process`: `emulator_process`, the emulator in a child process.

Nothing is imported here, so ``simulator.emulator.settings`` stays light for scenario loading.
"""
