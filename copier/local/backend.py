"""The local AWS backend: moto's server app behind hypercorn, on a loopback address only.

Why it is built this way:

* The KCL's Kinesis client speaks HTTP/2 only (cleartext h2c, prior
  knowledge), while boto3 and the KCL's DynamoDB client speak HTTP/1.1, and
  moto's own server speaks HTTP/1.1 only. hypercorn serves moto's WSGI app on
  one port and answers both, so one endpoint serves every client.
* moto's models are not thread-safe: under concurrent writers its Kinesis
  loses acknowledged records. Every request therefore runs under one
  process-wide lock (:data:`MOTO_LOCK`): process-wide, because moto's state
  is, so two backends in one process must not interleave either. The lock is
  granted in the order it was asked for (:class:`FifoLock`): a plain lock
  lets the thread that just released it, or any other, in first, and a
  request can wait behind many later ones. The protocol bounds how long a
  put received may take to become readable (the put timeout); a backend
  that starves one put past it breaks that bound (a duplicate the copier's
  verification cannot see), so the chaos suite would blame the copier.
* moto gets Kinesis resharding and a DynamoDB index race wrong in ways the
  copier and the KCL depend on; :mod:`copier.local.moto_patches` corrects
  them before the first request.
* moto checks no credentials: anyone who reaches the port can read and write
  everything. The backend refuses to bind anything but a loopback address.

moto's state is process-wide: two ``LocalBackend`` instances in one process
serve the same streams and tables. moto and hypercorn are imported lazily,
so importing this module needs neither (they are the ``test`` extra).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import ipaddress
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from copier.adapters.localkeys import DUMMY_ENV  # the credentials of local runs (re-exported here)

if TYPE_CHECKING:
    from hypercorn.config import Config

__all__ = [
    "DEFAULT_PORT",
    "DUMMY_ENV",
    "FifoLock",
    "MOTO_LOCK",
    "LocalBackend",
    "SerializedApp",
    "add_arguments",
    "main",
    "make_app",
    "spawned",
]

DEFAULT_PORT = 4566

STARTUP_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
EXIT_START_FAILED = 1


class FifoLock:
    """A lock granted in the order it was asked for (a ticket lock): no waiter is overtaken by a later one."""

    def __init__(self) -> None:
        self._changed = threading.Condition(threading.Lock())
        self._next = 0  # the ticket the next caller draws
        self._serving = 0  # the ticket that holds the lock

    def __enter__(self) -> FifoLock:
        with self._changed:
            ticket = self._next
            self._next += 1
            while ticket != self._serving:
                self._changed.wait()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._changed:
            self._serving += 1
            self._changed.notify_all()


#: Serialises every request to moto in this process, first come first served (see the module docstring).
MOTO_LOCK = FifoLock()

_log = logging.getLogger(__name__)

StartResponse = Callable[..., Any]
WSGIApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]


class SerializedApp:
    """A WSGI app that lets one request at a time into the app it wraps.

    The whole response body is built inside the lock: moto returns it ready
    made, and iterating it outside the lock could race the next request.
    hypercorn has read the whole request body before calling the app, so a
    slow client never holds the lock.
    """

    def __init__(self, app: WSGIApp, lock: FifoLock = MOTO_LOCK) -> None:
        self._app = app
        self._lock = lock

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
        with self._lock:
            result = self._app(environ, start_response)
            try:
                return list(result)
            finally:
                close = getattr(result, "close", None)
                if close is not None:
                    close()


def make_app() -> SerializedApp:
    """moto's server app (every service, dispatched on each request), patched and serialised."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

    from copier.local import moto_patches

    moto_patches.apply()
    return SerializedApp(DomainDispatcherApplication(create_backend_app))


def _loopback(host: str) -> tuple[str, socket.AddressFamily]:
    """The address to bind and its family; ValueError unless ``host`` is a loopback address."""
    literal = "127.0.0.1" if host == "localhost" else host
    try:
        address = ipaddress.ip_address(literal)
    except ValueError:
        raise ValueError(f"LocalBackend binds a loopback address only, got {host!r}") from None
    if not address.is_loopback:
        raise ValueError(f"LocalBackend binds a loopback address only, got {host!r}")
    return str(address), socket.AF_INET6 if address.version == 6 else socket.AF_INET


def _hypercorn_config() -> Config:
    from hypercorn.config import Config

    config = Config()
    # A Logger (not "-") so hypercorn leaves its handlers alone: its messages go
    # wherever the process's logging sends them (stderr by default), never stdout.
    config.errorlog = logging.getLogger("hypercorn.error")
    config.accesslog = None
    # Longer than the AWS SDK's idle-connection timeout (60 s), so the client,
    # not the server, closes idle pooled connections: no request races a close.
    config.keep_alive_timeout = 75
    # hypercorn closes a connection (GOAWAY on HTTP/2) after this many requests;
    # a KCL worker polls for hours on one connection.
    config.keep_alive_max_requests = 2**31
    config.graceful_timeout = 2
    # hypercorn answers a WSGI body over 16 MiB with an empty 400; a PutRecords of 10 MiB is 14 MiB in base64
    # JSON, so let moto (and the record-limit patch) see and judge anything up to this.
    config.wsgi_max_body_size = 64 * 1024 * 1024
    return config


class LocalBackend:
    """moto on ``host:port`` (HTTP/1.1 and h2c), served from a background thread.

    ``port=0`` picks a free port; the socket is bound before the server
    starts, so there is no window in which another process can take it.
    Use as a context manager, or call :meth:`start` and :meth:`stop`.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._host, self._family = _loopback(host)
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {port}")
        self._requested_port = port
        self._port: int | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._shutdown: asyncio.Event | None = None
        self._error: BaseException | None = None

    @property
    def port(self) -> int:
        """The bound port (the real one when constructed with ``port=0``)."""
        if self._port is None:
            raise RuntimeError("LocalBackend is not started")
        return self._port

    @property
    def endpoint(self) -> str:
        """The endpoint URL for every service, e.g. ``http://127.0.0.1:4566``."""
        host = f"[{self._host}]" if self._family == socket.AF_INET6 else self._host
        return f"http://{host}:{self.port}"

    def start(self) -> LocalBackend:
        """Bind, start serving, and return once the server answers HTTP requests."""
        if self._thread is not None:
            raise RuntimeError("LocalBackend already started")
        app = make_app()  # imports moto and patches it before any request can arrive
        # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets whose proto says TCP.
        # Without it each response on a kept-alive connection (headers, then body) waits for
        # the client's delayed ACK: measured 45 ms a request instead of 3.
        sock = socket.socket(self._family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self._host, self._requested_port))
            sock.listen(128)
        except BaseException:
            sock.close()
            raise
        self._port = int(sock.getsockname()[1])
        # Created here, run in the thread: stop() can always reach them.
        self._loop = asyncio.new_event_loop()
        self._shutdown = asyncio.Event()
        self._thread = threading.Thread(
            target=self._run,
            args=(app, sock, self._loop, self._shutdown),
            name=f"copier-local-backend-{self._port}",
            daemon=True,
        )
        self._thread.start()
        try:
            self._wait_until_serving()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Stop serving, close the port and join the server's threads; safe to call twice."""
        thread, loop, shutdown = self._thread, self._loop, self._shutdown
        if thread is None:
            return
        if loop is not None and shutdown is not None:
            try:
                loop.call_soon_threadsafe(shutdown.set)
            except RuntimeError:
                pass  # the loop has already finished
        thread.join(timeout)
        if thread.is_alive():
            raise RuntimeError(f"local backend on port {self._port} did not stop within {timeout} s")
        self._thread = self._loop = self._shutdown = None

    def __enter__(self) -> LocalBackend:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _run(
        self, app: SerializedApp, sock: socket.socket, loop: asyncio.AbstractEventLoop, shutdown: asyncio.Event
    ) -> None:
        """The server thread: runs ``loop`` until ``shutdown``; closes the socket, loop and executor."""
        from hypercorn.asyncio.run import worker_serve
        from hypercorn.config import Sockets
        from hypercorn.utils import wrap_app

        config = _hypercorn_config()
        # hypercorn runs each WSGI request in the loop's default executor; named
        # threads, joined when the loop is done.
        executor = ThreadPoolExecutor(max_workers=16, thread_name_prefix=f"copier-local-backend-{self._port}")
        loop.set_default_executor(executor)

        async def serve() -> None:
            # hypercorn's public serve() cannot take an already bound socket object;
            # worker_serve is what it calls (hypercorn is pinned in setup.cfg).
            await worker_serve(
                wrap_app(app, config.wsgi_max_body_size, "wsgi"),
                config,
                sockets=Sockets(secure_sockets=[], insecure_sockets=[sock], quic_sockets=[]),
                shutdown_trigger=shutdown.wait,
            )

        try:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(serve())
        except BaseException as error:  # reported by start(), or logged if it happens later
            self._error = error
            _log.error("local backend on port %s failed", self._port, exc_info=True)
        finally:
            sock.close()
            try:
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                asyncio.set_event_loop(None)
                loop.close()
                executor.shutdown(wait=True, cancel_futures=True)

    def _wait_until_serving(self) -> None:
        """Poll with a real HTTP request: the socket listens before hypercorn serves it."""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if self._thread is None or not self._thread.is_alive():
                raise RuntimeError(f"local backend on port {self._port} failed to start") from self._error
            connection = http.client.HTTPConnection(self._host, self.port, timeout=1)
            try:
                connection.request("GET", "/moto-api/", headers={"Connection": "close"})
                connection.getresponse().read()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"local backend on port {self._port} did not answer within {STARTUP_TIMEOUT_S} s"
                    ) from None
                time.sleep(0.05)
            finally:
                connection.close()


@contextlib.contextmanager
def spawned(**env: str) -> Iterator[str]:
    """Run ``copier local-backend`` in a process of its own on a free port; yield its URL; always stop it.

    A process of its own, so that moto's settings can come from ``env``
    (moto's request recorder: ``MOTO_ENABLE_RECORDING``, ``MOTO_RECORDER_FILEPATH``).
    """
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [str(Path(sys.executable).with_name("copier")), "local-backend", "--port", str(port)],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        ready = proc.stdout.readline().split()
        if len(ready) != 2 or ready[0] != "READY":
            raise RuntimeError(f"the local backend did not start (status {proc.poll()}): {ready}")
        yield ready[1]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be in 0..65535, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``copier local-backend``."""
    from copier.local.streams import parse_streams

    parser.add_argument(
        "--impl",
        choices=("moto", "independent"),
        default="moto",
        help="moto (default: fast, one port for both services, patched by copier) or independent: kinesis-mock "
        "and dynalite (make install), each on an ephemeral 127.0.0.1 port; READY then names both",
    )
    parser.add_argument(
        "--port", type=_port, default=DEFAULT_PORT, help=f"port to bind (default {DEFAULT_PORT}; moto only)"
    )
    parser.add_argument(
        "--lease-table",
        action="append",
        default=[],
        metavar="APPLICATION_NAME",
        help="independent only: create the KCL lease table of this applicationName with its index first "
        "(dynalite cannot add the index the KCL adds later); may be given more than once",
    )
    parser.add_argument(
        "--streams",
        type=parse_streams,
        default=[],
        metavar="NAME:SHARDS,...",
        help="Kinesis streams to create at the start, e.g. staging:4,target:2 (the backend keeps everything in "
        "memory: they, and all else, are gone when it stops)",
    )
    parser.add_argument(
        "--region", default="us-east-1", help="the region of those streams: the properties' regionName (us-east-1)"
    )


def main(args: argparse.Namespace) -> int:
    """``copier local-backend [--impl moto|independent] [--port N] [--streams NAME:SHARDS,...]``: serve on
    127.0.0.1 until SIGTERM or SIGINT, with the streams created first.

    Prints exactly one line to stdout, ``READY http://127.0.0.1:N`` (independent: ``READY
    kinesis=http://127.0.0.1:N dynamodb=http://127.0.0.1:M``, :mod:`copier.local.independent`), once the
    server answers and the streams exist, so a parent process can wait for
    it; everything else goes to stderr. Returns 0 after a clean stop, 1 if the
    server cannot start or a stream cannot be created.
    """
    # Block the stop signals in this thread before any other thread exists (threads
    # inherit the mask), then wait for them synchronously: no handler can run in the
    # middle of start() or stop(), and a signal that arrives during start() is kept.
    stop_signals = {signal.SIGTERM, signal.SIGINT}
    previous_mask = signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    protocol_out = sys.stdout
    sys.stdout = sys.stderr  # anything that prints while serving goes to stderr
    try:
        if args.impl == "independent":
            from copier.local.independent import serve

            return serve(args, protocol_out, stop_signals, _create_streams)
        if args.lease_table:
            sys.stderr.write("copier local-backend: --lease-table is for --impl independent (moto needs none)\n")
            return EXIT_START_FAILED
        backend = LocalBackend("127.0.0.1", args.port)
        try:
            backend.start()
        except (OSError, RuntimeError) as error:
            sys.stderr.write(f"copier local-backend: cannot serve on 127.0.0.1:{args.port}: {error}\n")
            return EXIT_START_FAILED
        try:
            if args.streams and not _create_streams(backend.endpoint, args.region, args.streams):
                return EXIT_START_FAILED
            print(f"READY {backend.endpoint}", file=protocol_out, flush=True)
            received = signal.sigwait(stop_signals)
            _log.info("local backend: %s received, stopping", signal.Signals(received).name)
        finally:
            backend.stop()
        return 0
    finally:
        sys.stdout = protocol_out
        signal.pthread_sigmask(signal.SIG_SETMASK, previous_mask)


def _create_streams(endpoint: str, region: str, specs: list[tuple[str, int]]) -> bool:
    """The streams of ``--streams`` made, and said on stderr; False (said) if the backend refused one."""
    import botocore.exceptions

    from copier.local.streams import create_streams

    try:
        create_streams(endpoint, region, specs)
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError) as error:
        sys.stderr.write(f"copier local-backend: cannot create the streams: {error}\n")
        return False
    made = ", ".join(f"{name} ({shards} shard{'s' if shards > 1 else ''})" for name, shards in specs)
    sys.stderr.write(
        f"copier local-backend: created {made} in {region}; everything lives in this process's memory, "
        "gone when it stops\n"
    )
    return True
