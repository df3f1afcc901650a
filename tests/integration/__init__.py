"""Tests against a real vLLM server (CPU build); a package, so that the server its conftest starts is
stopped once these tests are done rather than at the end of the whole session."""
