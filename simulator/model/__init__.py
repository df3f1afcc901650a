"""Workload models: fit, generate, fidelity."""
