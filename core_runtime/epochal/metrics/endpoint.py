"""The supervisor's metrics endpoint (``--metrics-port``): ``GET /metrics`` of one job in
Prometheus text (:mod:`epochal.metrics.exposition`), bounded in connections and time."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from epochal.metrics.exposition import CONTENT_TYPE, render_prometheus

if TYPE_CHECKING:
    from epochal.state.jobs import JobDirectory


MAX_CONNECTIONS = 8
"""Connections the endpoint serves at once (one thread each); more are closed at once."""
CONNECTION_TIMEOUT = 5.0
"""Seconds a connection may stay silent (before or inside its request) before it is closed."""


class MetricsServer(ThreadingHTTPServer):
    """The metrics endpoint's HTTP server, bounded: it serves at most ``max_connections``
    connections at once, each on its own daemon thread, closes any connection beyond them
    at once (a scraper retries at its next interval), and closes a connection that sends
    nothing for ``timeout`` seconds. It runs in the supervisor, beside the thread that
    renews the job's lease, so idle or slow clients must never pile up threads there.

    Made by :func:`listen` (bound, not yet serving: a busy port is refused before anything
    of the job is written); :func:`serve` starts it for a job."""

    daemon_threads = True
    request_queue_size = 128

    def __init__(
        self,
        address: tuple[str, int],
        *,
        max_connections: int = MAX_CONNECTIONS,
        timeout: float = CONNECTION_TIMEOUT,
    ) -> None:
        self.jobdir: JobDirectory | None = None
        self.connection_timeout = timeout
        self._slots = threading.BoundedSemaphore(max_connections)
        super().__init__(address, _MetricsHandler)

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve the connection on a thread of its own if a slot is free, else close it."""
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        """One connection, on its thread; its slot is freed when it ends."""
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class _MetricsHandler(BaseHTTPRequestHandler):
    """``GET /metrics`` (and ``/``): the job's metrics in Prometheus text, read afresh."""

    server: MetricsServer

    def setup(self) -> None:
        self.timeout = self.server.connection_timeout  # type: ignore[misc]  # per connection
        super().setup()

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] not in ("/metrics", "/"):
            self.send_error(404, "only /metrics is here")
            return
        try:
            assert self.server.jobdir is not None, "the endpoint serves no job yet"
            body = render_prometheus(self.server.jobdir).encode()
        except Exception as exc:  # a scrape must not take the supervisor down
            self.send_error(500, f"metrics: {type(exc).__name__}: {exc}")
            return
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return  # no access log on the supervisor's output


def listen(
    port: int,
    host: str = "127.0.0.1",
    *,
    max_connections: int = MAX_CONNECTIONS,
    timeout: float = CONNECTION_TIMEOUT,
) -> MetricsServer:
    """A bounded metrics server bound to ``host:port`` (``port`` 0: a free one, see
    ``server.server_address``), not serving yet. Called before the job's lease is taken and
    before its record is written, so that a port that is out of range, busy or not this
    host's fails first.

    Raises:
        ConfigError: naming the address, why it cannot be listened on, and what to do.
    """
    from epochal_sdk import ConfigError

    if not 0 <= int(port) <= 65535:
        raise ConfigError(
            "job",
            "metrics_port",
            f"{port} is not a TCP port",
            "Give a port from 1 to 65535, or 0 for a free one (printed when it listens).",
        )
    try:
        return MetricsServer((host, int(port)), max_connections=max_connections, timeout=timeout)
    except OSError as exc:
        raise ConfigError(
            "job",
            "metrics_port",
            f"the metrics endpoint cannot listen on {host}:{port} "
            f"({exc.strerror or type(exc).__name__})",
            "Give a free port (0: one chosen and printed), or another --metrics-host; "
            "`ss -ltnp` shows which process holds a port.",
        ) from None


def serve(
    jobdir: JobDirectory, port: int | MetricsServer, host: str = "127.0.0.1"
) -> MetricsServer:
    """Serve ``GET /metrics`` (Prometheus text, read afresh at every scrape) for one job on
    a daemon thread, through ``port``: a server from :func:`listen`, or a port number to
    listen on (0 picks a free port: ``server.server_address``). Stop it with
    ``server.shutdown()`` and ``server.server_close()``."""
    server = port if isinstance(port, MetricsServer) else listen(port, host)
    server.jobdir = jobdir
    threading.Thread(target=server.serve_forever, name="epochal-metrics", daemon=True).start()
    return server
