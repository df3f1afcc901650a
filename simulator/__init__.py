"""agentload: a load simulator for LLM servers under agent traffic."""

__version__ = "0.1.0"
