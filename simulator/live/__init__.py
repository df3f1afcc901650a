"""Live runs: asyncio driver, HTTP client, prompt builder, probes, vLLM launcher (the emulator is `simulator.emulator`)."""
