"""Server handles returned by the fixtures, and the backends that run the servers.

A *handle* (:class:`Server` subclass) carries connection info and exposes fault controls;
a *backend* does the work: :class:`LocalBackend` runs a process on this machine,
:class:`ExternalBackend` stands for a server named by an environment variable, and the
testcontainers backend lives in :mod:`integration.harness.containers`.
"""

from __future__ import annotations

import abc
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ._process import (
    HarnessError,
    ManagedProcess,
    ServerStartError,
    remove_temp_dir,
    shutting_down,
    tail_file,
    wait_until,
)


class FaultControlUnsupportedError(HarnessError):
    """Fault controls (stop/kill/start) are not available for this server backend."""


class Backend(abc.ABC):
    """How a server is run: start/stop/kill it, wait for readiness, read its log."""

    name: str = "server"
    supports_faults: bool = False

    @abc.abstractmethod
    def start(self) -> None:
        """Start the server (no-op if running) and wait until it is ready."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Stop the server gracefully; its data survives."""

    @abc.abstractmethod
    def kill(self) -> None:
        """Kill the server abruptly (SIGKILL); its data on disk survives."""

    def pause(self) -> None:
        """Freeze the server (every process of it stopped where it is, connections open)."""
        raise FaultControlUnsupportedError(f"{self.name}: no pause for this server")

    def unpause(self) -> None:
        """Let a frozen server go on where it was."""
        raise FaultControlUnsupportedError(f"{self.name}: no pause for this server")

    @abc.abstractmethod
    def is_running(self) -> bool:
        """Whether the server process is alive."""

    @abc.abstractmethod
    def log_tail(self, lines: int = 80) -> str:
        """The last lines of the server log (empty if there is none)."""

    @abc.abstractmethod
    def close(self) -> None:
        """Final teardown: stop the server and remove everything it left on disk."""


class ExternalBackend(Backend):
    """A server that somebody else runs (named by an ``EPOCHAL_*`` environment variable)."""

    supports_faults = False

    def __init__(self, name: str, description: str) -> None:
        self.name = name
        self.description = description

    def _unsupported(self) -> FaultControlUnsupportedError:
        return FaultControlUnsupportedError(
            f"{self.name}: fault controls are not available for an external server "
            f"({self.description})"
        )

    def start(self) -> None:
        """External servers are assumed to be running; nothing to start."""

    def stop(self) -> None:
        """Not supported: raises :class:`FaultControlUnsupportedError`."""
        raise self._unsupported()

    def kill(self) -> None:
        """Not supported: raises :class:`FaultControlUnsupportedError`."""
        raise self._unsupported()

    def is_running(self) -> bool:
        """Always ``True``: we cannot tell otherwise."""
        return True

    def log_tail(self, lines: int = 80) -> str:
        """External servers' logs are not visible to the harness."""
        return f"<external server: {self.description}; no log available>"

    def close(self) -> None:
        """Nothing to tear down."""


class LocalBackend(Backend):
    """A server process on this machine, kept in a registered temporary directory.

    Subclasses build ``self.process`` in ``__init__`` (after any one-time preparation such
    as formatting storage) and implement :meth:`probe`, a readiness check through the
    real client that returns truthy when the server accepts work.
    """

    supports_faults = True
    start_timeout: float = 120.0

    def __init__(self, name: str, workdir: Path, process: ManagedProcess) -> None:
        self.name = name
        self.workdir = workdir
        self.process = process
        self._lock = threading.RLock()

    @property
    def log_path(self) -> Path:
        """The server's log file."""
        return self.process.log_path

    @abc.abstractmethod
    def probe(self) -> bool:
        """One readiness probe through the real client; truthy when ready."""

    def start(self) -> None:
        """Start the process if needed and poll :meth:`probe` until ready (with deadline)."""
        with self._lock:
            if not self.process.running:
                self.process.start()
            self.wait_ready()

    def wait_ready(self) -> None:
        """Poll the readiness probe; fail fast if the process exits."""

        def ready() -> bool:
            if not self.process.running:
                raise ServerStartError(
                    f"{self.name} exited with code {self.process.returncode} before it was "
                    f"ready; log {self.log_path}:\n{self.log_tail(60)}"
                )
            return bool(self.probe())

        try:
            wait_until(ready, self.start_timeout, f"{self.name} to become ready", interval=0.25)
        except ServerStartError:
            raise
        except TimeoutError as exc:
            raise ServerStartError(f"{exc}\nlog {self.log_path}:\n{self.log_tail(60)}") from exc

    def stop(self) -> None:
        """Stop gracefully (SIGTERM or the server's fast-shutdown signal)."""
        with self._lock:
            self.process.stop()

    def kill(self) -> None:
        """SIGKILL the server's process group."""
        with self._lock:
            self.process.kill()

    def pause(self) -> None:
        """SIGSTOP the server's process group."""
        with self._lock:
            self.process.signal_group(signal.SIGSTOP)

    def unpause(self) -> None:
        """SIGCONT the server's process group."""
        with self._lock:
            self.process.signal_group(signal.SIGCONT)

    def is_running(self) -> bool:
        """Whether the server process is alive."""
        return self.process.running

    def log_tail(self, lines: int = 80) -> str:
        """The last lines of the server log."""
        return tail_file(self.log_path, lines)

    def close(self) -> None:
        """Kill the server and remove its temporary directory.

        The data is thrown away, so a graceful shutdown would only cost time.
        """
        with self._lock:
            try:
                self.process.forget()
            finally:
                remove_temp_dir(self.workdir)


@dataclass
class Server:
    """Base of the handles the server fixtures return: fault controls and logs."""

    backend: Backend = field(repr=False, compare=False)

    @property
    def supports_faults(self) -> bool:
        """Whether stop/kill/start/restart work for this server (local processes: yes)."""
        return self.backend.supports_faults

    def require_faults(self) -> None:
        """Skip the calling test unless fault controls are available."""
        if not self.supports_faults:
            import pytest

            pytest.skip(f"{self.backend.name}: fault controls need a harness-run server")

    def start(self) -> None:
        """Start the server again (after :meth:`stop`/:meth:`kill`) and await readiness."""
        if self.supports_faults:
            self.backend.start()
        elif not self.backend.is_running():
            raise FaultControlUnsupportedError(f"{self.backend.name}: cannot start")

    def stop(self) -> None:
        """Stop the server gracefully; its data directory is kept."""
        self.backend.stop()

    def kill(self) -> None:
        """Kill the server with SIGKILL (``kill -9``); its data directory is kept."""
        self.backend.kill()

    def pause(self) -> None:
        """Freeze the server (a container's cgroup freezer, a local process's SIGSTOP): its
        connections stay open and silent until :meth:`unpause`."""
        self.backend.pause()

    def unpause(self) -> None:
        """Let the frozen server go on."""
        self.backend.unpause()

    def restart(self, *, hard: bool = False) -> None:
        """Stop (or, with ``hard=True``, kill -9) and start again, awaiting readiness."""
        if hard:
            self.kill()
        else:
            self.stop()
        self.start()

    def ensure_running(self) -> None:
        """Start the server if a test left it stopped (used between tests)."""
        if shutting_down():
            return
        if self.supports_faults and not self.backend.is_running():
            self.backend.start()

    @property
    def running(self) -> bool:
        """Whether the server process is alive."""
        return self.backend.is_running()

    def log_tail(self, lines: int = 80) -> str:
        """The last lines of the server log, for failure reports."""
        return self.backend.log_tail(lines)
