"""Whether an endpoint answers at all, found in seconds: a TCP connection to its host and port.

Why not the first AWS call itself: botocore retries a connection that fails
(3 attempts, 5 s connect timeouts each, in copier's clients), and the KCL
daemon retries its initialisation 20 times, so a backend that is down, a
misspelt region (its endpoint name does not resolve) or a firewall took
from 52 s to two minutes to be said (issue 45). A connection attempt tells
the three apart (refused, a name that does not resolve, no answer), in
parallel for every endpoint the start needs, within :data:`PROBE_S`.

An endpoint reached through an HTTP proxy (``HTTPS_PROXY`` and the like, as
botocore reads them: ``copier.adapters.awsjson.usable``) is not probed: the
connection would not go where botocore's goes.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from copier.adapters.awsjson import usable

__all__ = ["PROBE_S", "Unreached", "unreached"]

PROBE_S = 3.0


@dataclass(frozen=True)
class Unreached:
    """An endpoint that did not answer: ``kind`` refused, dns, timeout or error; ``detail`` the system's words."""

    url: str
    kind: str
    detail: str


def _probe(url: str, timeout_s: float) -> Unreached | None:
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except socket.gaierror as exc:
        return Unreached(url, "dns", exc.strerror or str(exc))
    except ConnectionRefusedError:
        return Unreached(url, "refused", "connection refused")
    except TimeoutError:
        return Unreached(url, "timeout", f"{timeout_s:g} s")
    except OSError as exc:
        return Unreached(url, "error", exc.strerror or str(exc))
    return None


def unreached(urls: Sequence[str], timeout_s: float = PROBE_S) -> list[Unreached]:
    """The endpoints of ``urls`` that do not answer a TCP connection, in the order given, found within about
    ``timeout_s`` whatever their number (a name whose lookup outlasts it counts as no answer)."""
    found: dict[str, Unreached | None] = {}
    lock = threading.Lock()

    def run(url: str) -> None:
        result = _probe(url, timeout_s)
        with lock:
            found[url] = result

    probed = [url for url in dict.fromkeys(urls) if usable(url)]
    threads = [threading.Thread(target=run, args=(url,), name="copier-reach", daemon=True) for url in probed]
    deadline = time.monotonic() + timeout_s + 0.5
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    out = []
    with lock:
        for url in probed:
            if url not in found:  # still looking the name up, or still connecting
                out.append(Unreached(url, "timeout", f"{timeout_s:g} s"))
            elif (result := found[url]) is not None:
                out.append(result)
    return out
