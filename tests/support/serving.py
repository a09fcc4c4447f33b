"""Small servers that tests stand in for services the local backend does not serve (bound to 127.0.0.1)."""

from __future__ import annotations

import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

S = TypeVar("S", bound=socketserver.BaseServer)


@contextmanager
def serving(server: S, poll_s: float = 0.5) -> Iterator[S]:
    """Serve from a daemon thread, looking for a shutdown every ``poll_s`` (what stopping it waits at most);
    shut down and close the socket afterwards."""
    thread = threading.Thread(target=server.serve_forever, args=(poll_s,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
