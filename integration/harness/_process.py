"""Process, port, log and clean-up utilities shared by the local server backends.

Every server process is started in its own session (and so its own process group), its
output goes to a log file, and it is registered in a module-level registry so that it is
killed - together with its temporary directories - at interpreter exit, on SIGTERM/SIGINT/
SIGHUP, and (when started from the main thread) when the Python process dies (Linux
``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from epochal.base.processes import alive

T = TypeVar("T")

HOST = "127.0.0.1"
"""Every local server listens on loopback only."""

#: Exceptions that mean "bug or missing package", never "server not ready yet".
FATAL_ERRORS: tuple[type[BaseException], ...] = (
    AttributeError,
    ImportError,
    NameError,
    TypeError,
)

_LOCK = threading.RLock()
_PROCESSES: list[ManagedProcess] = []
_TEMP_DIRS: list[Path] = []
_HANDLERS_INSTALLED = False
_SIGNALS_INSTALLED = False
_SHUTTING_DOWN = threading.Event()
_PR_SET_PDEATHSIG = 1


class HarnessError(RuntimeError):
    """A server of the integration-test harness could not be provided."""


class PrerequisiteError(HarnessError):
    """A tool the harness needs (Java, Maven, PostgreSQL, a download) is missing."""


class ServerStartError(HarnessError):
    """A server process did not become ready; the message carries its log tail."""


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that is free right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` TCP ports on ``host``, free right now and all different: each is held while
    the next is picked (ports picked one after the other by :func:`free_port` may repeat, and
    a server given one port twice fails to bind its second listener)."""
    held: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            held.append(sock)
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in held]
    finally:
        for sock in held:
            sock.close()


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """Return whether a TCP connection to ``host:port`` succeeds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_until(
    condition: Callable[[], T],
    timeout: float,
    what: str,
    interval: float = 0.2,
    on_timeout: Callable[[], str] | None = None,
) -> T:
    """Poll ``condition`` until it returns a truthy value or ``timeout`` seconds pass.

    Exceptions raised by ``condition`` count as "not yet" (except :data:`FATAL_ERRORS` and
    :class:`HarnessError`, which propagate); the last one is reported when the deadline
    passes. Returns the truthy value.
    """
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            result = condition()
            if result:
                return result
        except (*FATAL_ERRORS, HarnessError):
            raise
        except Exception as exc:
            last_error = exc
        if time.monotonic() >= deadline:
            detail = f" (last error: {last_error!r})" if last_error else ""
            extra = f"\n{on_timeout()}" if on_timeout else ""
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{detail}{extra}")
        time.sleep(interval)


def tail_file(path: Path, lines: int = 80, max_bytes: int = 64_000) -> str:
    """Return the last ``lines`` lines of a (log) file, or a note if it does not exist."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - max_bytes))
            data = handle.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return f"<no log file {path}>"
    return "\n".join(data.splitlines()[-lines:])


OWNER_FILE = ".epochal-harness-owner"


def sweep_stale_temp_dirs(prefix: str) -> None:
    """Remove temp dirs with ``prefix`` left by a harness process that no longer exists.

    A SIGKILLed test run cannot clean up after itself; its servers die with it (parent
    death signal), and the next run removes the directories here.
    """
    for path in Path(tempfile.gettempdir()).glob(f"{prefix}*"):
        marker = path / OWNER_FILE
        try:
            pid = int(marker.read_text().strip())
        except (OSError, ValueError):
            continue
        if pid != os.getpid() and not alive(pid):
            shutil.rmtree(path, ignore_errors=True)


def make_temp_dir(prefix: str, owner: str | None = None) -> Path:
    """Create a registered temporary directory (removed at exit), optionally chowned."""
    sweep_stale_temp_dirs(prefix)
    path = Path(tempfile.mkdtemp(prefix=prefix))
    (path / OWNER_FILE).write_text(f"{os.getpid()}\n")
    if owner is not None:
        shutil.chown(path, user=owner, group=owner)
    with _LOCK:
        _TEMP_DIRS.append(path)
    install_cleanup_handlers()
    return path


def remove_temp_dir(path: Path) -> None:
    """Remove a temporary directory created by :func:`make_temp_dir` (idempotent)."""
    shutil.rmtree(path, ignore_errors=True)
    with _LOCK:
        if path in _TEMP_DIRS:
            _TEMP_DIRS.remove(path)


def run_checked(
    cmd: Sequence[str],
    what: str,
    timeout: float = 300,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    user: str | None = None,
) -> str:
    """Run a short-lived helper command; raise :class:`HarnessError` with its output on failure."""
    try:
        proc = subprocess.run(
            list(cmd),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            user=user,
            group=user,
            extra_groups=[] if user else None,
            check=False,
        )
    except FileNotFoundError as exc:
        raise PrerequisiteError(f"{what}: command not found: {cmd[0]}") from exc
    except subprocess.TimeoutExpired as exc:
        raise HarnessError(f"{what}: timed out after {timeout}s: {' '.join(cmd)}") from exc
    if proc.returncode != 0:
        output = (proc.stdout + proc.stderr)[-4000:]
        raise HarnessError(f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n{output}")
    return proc.stdout


def _set_parent_death_signal() -> None:
    """Child-side hook: die with SIGKILL when the parent thread (the harness) dies."""
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class ManagedProcess:
    """A long-running server process in its own process group, logging to ``log_path``."""

    name: str
    argv: list[str]
    log_path: Path
    env: dict[str, str] | None = None
    cwd: Path | None = None
    user: str | None = None
    stop_signal: int = signal.SIGTERM
    stop_timeout: float = 30.0
    _popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int | None:
        """The process id while running, else ``None``."""
        return self._popen.pid if self.running else None

    @property
    def running(self) -> bool:
        """Whether the process has been started and has not exited."""
        return self._popen is not None and self._popen.poll() is None

    @property
    def returncode(self) -> int | None:
        """The exit code of the last run, if it ended."""
        return None if self._popen is None else self._popen.poll()

    def start(self) -> None:
        """Start the process (no-op if it is running); output is appended to the log."""
        if self.running:
            return
        if _SHUTTING_DOWN.is_set():
            raise HarnessError(f"{self.name}: not started, the harness is shutting down")
        install_cleanup_handlers()
        main_thread = threading.current_thread() is threading.main_thread()
        with self.log_path.open("ab") as log:
            log.write(f"\n===== harness: starting {self.name}: {' '.join(self.argv)}\n".encode())
            log.flush()
            self._popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
                user=self.user,
                group=self.user,
                extra_groups=[] if self.user else None,
                preexec_fn=_set_parent_death_signal if main_thread else None,
            )
        with _LOCK:
            if self not in _PROCESSES:
                _PROCESSES.append(self)

    def stop(self, timeout: float | None = None) -> None:
        """Stop gracefully with ``stop_signal``; SIGKILL the group if it does not exit."""
        if not self.running:
            self._reap()
            return
        self._signal_group(self.stop_signal)
        try:
            assert self._popen is not None
            self._popen.wait(timeout=self.stop_timeout if timeout is None else timeout)
        except subprocess.TimeoutExpired:
            self._note(f"did not stop within {self.stop_timeout}s; sending SIGKILL")
        self.kill()

    def kill(self) -> None:
        """``kill -9`` the server: its process group and every descendant, then wait.

        Descendants are killed one by one too, because some servers move their children
        into sessions of their own (PostgreSQL's backends call ``setsid``).
        """
        if not self.running:  # already exited and reaped: its pid may be reused, hands off
            self._reap()
            return
        assert self._popen is not None
        tree = [self._popen.pid, *_descendants(self._popen.pid)]
        self._signal_group(signal.SIGKILL)
        for pid in tree[1:]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self._reap()
        _wait_gone(tree)

    def _reap(self) -> None:
        if self._popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._popen.wait(timeout=30)

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the server's process group (while it runs)."""
        if self.running:
            self._signal_group(sig)

    def _signal_group(self, sig: int) -> None:
        if self._popen is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._popen.pid, sig)

    def _note(self, text: str) -> None:
        with contextlib.suppress(OSError), self.log_path.open("a") as log:
            log.write(f"\n===== harness: {self.name} {text}\n")

    def forget(self) -> None:
        """Kill the process and drop it from the clean-up registry."""
        self.kill()
        with _LOCK:
            if self in _PROCESSES:
                _PROCESSES.remove(self)


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """``(state, ppid)`` of a process from ``/proc``, or ``None`` if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rsplit(")", 1)[-1].split()
    return fields[0], int(fields[1])


def _descendants(root: int) -> list[int]:
    """All live descendants of ``root`` (Linux ``/proc``; empty elsewhere)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else ():
        if entry.name.isdigit() and (stat := _proc_stat(int(entry.name))) is not None:
            children.setdefault(stat[1], []).append(int(entry.name))
    found: list[int] = []
    pending = [root]
    while pending:
        for child in children.get(pending.pop(), []):
            found.append(child)
            pending.append(child)
    return found


def _wait_gone(pids: list[int], timeout: float = 10.0) -> None:
    """Wait until every pid has exited (a zombie counts as exited)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = [_proc_stat(pid) for pid in pids]
        if all(state is None or state[0] in ("Z", "X") for state in states):
            return
        time.sleep(0.02)


def shutting_down() -> bool:
    """Whether :func:`cleanup_all` ran (exit or a fatal signal): start nothing any more."""
    return _SHUTTING_DOWN.is_set()


def cleanup_all() -> None:
    """Kill every registered process group and remove every registered temporary directory."""
    _SHUTTING_DOWN.set()
    with _LOCK:
        processes = list(_PROCESSES)
        temp_dirs = list(_TEMP_DIRS)
    for process in processes:
        with contextlib.suppress(Exception):
            process.kill()
    for path in temp_dirs:
        shutil.rmtree(path, ignore_errors=True)
    with _LOCK:
        _PROCESSES.clear()
        _TEMP_DIRS.clear()


def _fatal_signal_handler(previous: Any) -> Callable[[int, Any], None]:
    def handler(signum: int, frame: Any) -> None:
        cleanup_all()
        if callable(previous):
            previous(signum, frame)
            return
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    return handler


def install_cleanup_handlers() -> None:
    """Install the atexit hook, and SIGTERM/SIGINT/SIGHUP handlers (from the main thread)."""
    global _HANDLERS_INSTALLED, _SIGNALS_INSTALLED
    with _LOCK:
        if not _HANDLERS_INSTALLED:
            _HANDLERS_INSTALLED = True
            atexit.register(cleanup_all)
        if _SIGNALS_INSTALLED or threading.current_thread() is not threading.main_thread():
            return
        _SIGNALS_INSTALLED = True
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        previous = signal.getsignal(signum)
        if previous is signal.SIG_IGN:
            continue
        signal.signal(signum, _fatal_signal_handler(previous))
