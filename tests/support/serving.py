"""Small servers that tests stand in for services the local backend does not serve (bound to 127.0.0.1)."""

from __future__ import annotations

import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

S = TypeVar("S", bound=socketserver.BaseServer)


@contextmanager
def serving(server: S) -> Iterator[S]:
    """Serve from a daemon thread; shut down and close the socket afterwards."""
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
