"""An ASGI middleware that names a fleet replica in every response, for servers agentload launches
that have no such setting of their own (vLLM: ``--middleware agentload_replica_header.ReplicaHeader``).

It runs inside the server's own Python, which does not have agentload installed: this file imports
nothing but the standard library, and its folder alone is put on the server's ``PYTHONPATH``. The
replica's name comes from ``$AGENTLOAD_REPLICA``, the header's from ``$AGENTLOAD_REPLICA_HEADER``
(`simulator.scenario.fleet.REPLICA_HEADER` by default, as the built-in emulator sends it).
"""

from __future__ import annotations

import os

NAME_ENV = "AGENTLOAD_REPLICA"
HEADER_ENV = "AGENTLOAD_REPLICA_HEADER"
DEFAULT_HEADER = "x-agentload-replica"


class ReplicaHeader:
    """Adds the replica's header to the start of every HTTP response (streamed ones too: the header
    goes out with the status line, before the first token)."""

    def __init__(self, app):
        self.app = app
        name = os.environ.get(NAME_ENV, "")
        header = os.environ.get(HEADER_ENV, DEFAULT_HEADER)
        self.header = (header.lower().encode("latin-1"), name.encode("latin-1")) if name else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or self.header is None:
            await self.app(scope, receive, send)
            return
        header = self.header

        async def named(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), header]}
            await send(message)

        await self.app(scope, receive, named)
