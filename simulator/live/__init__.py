"""Live runs: asyncio driver, HTTP client, prompt builder, emulator, probes."""
