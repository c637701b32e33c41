"""The processes of one driver run, found and ended as a whole.

A driver run is more than one process: the Python driver, its JVM, PySpark's daemons (which
put themselves in their own process groups) and their forked workers. Killing the driver's
process group misses the daemons. So every run gets a *run token* in its environment, which
every descendant inherits (``/proc/<pid>/environ`` keeps it, forks included); the run's
processes are the ones that carry the token, wherever they were re-parented to.

Every run also gets a *scratch directory*, named after its token, for its temporary files
(the driver's ``TMPDIR``, which its JVM follows): what a killed run leaves there (Spark's local
directories, the native libraries the JVM unpacks, a warm-up's checkpoint) is removed with the
directory once the run ended.

Also here: the parent-death signal that keeps a driver from outliving its supervisor.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import tempfile
import time
import uuid

RUN_TOKEN_ENV = "EPOCHAL_RUN_TOKEN"
"""The environment variable that marks every process of one driver run."""
SUPERVISOR_PID_ENV = "EPOCHAL_SUPERVISOR_PID"
"""The pid of the supervisor of a driver run (inherited by all the run's processes)."""

SCRATCH_PREFIX = "epochal-run-"
"""The name of a driver run's scratch directory: this, then its run token."""

_PR_SET_PDEATHSIG = 1


def new_run_token() -> str:
    """A token for a new driver run."""
    return uuid.uuid4().hex


_TOKEN_ENTRY = f"{RUN_TOKEN_ENV}=".encode()


def _run_token(pid: int) -> str | None:
    """The run token in a process's environment (None: it has none, is gone, or is not ours
    to read)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            environ = fh.read()
    except OSError:
        return None
    if environ.startswith(_TOKEN_ENTRY):
        start = len(_TOKEN_ENTRY)
    else:  # an entry's start, not a value or another name that ends the same way
        start = environ.find(b"\0" + _TOKEN_ENTRY)
        if start < 0:
            return None
        start += 1 + len(_TOKEN_ENTRY)
    end = environ.find(b"\0", start)
    return environ[start : end if end >= 0 else len(environ)].decode(errors="replace")


def _run_tokens() -> dict[int, str]:
    """Every live process (not a zombie) that carries a run token, with its token (empty on
    systems without ``/proc``)."""
    if not os.path.isdir("/proc"):
        return {}
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        token = _run_token(int(name))
        if token is not None and not _is_zombie(int(name)):
            found[int(name)] = token
    return found


def processes_of(token: str) -> list[int]:
    """The live processes other than this one that carry ``token`` (empty on systems without
    ``/proc``)."""
    if not token:
        return []
    me = os.getpid()
    return [pid for pid, carried in _run_tokens().items() if carried == token and pid != me]


def _live_tokens() -> set[str]:
    """The run tokens that some live process carries."""
    return set(_run_tokens().values())


def command_line(pid: int) -> bytes:
    """The process' arguments, NUL-separated as in ``/proc/<pid>/cmdline`` (empty: gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def python_workers(token: str) -> list[int]:
    """The PySpark Python processes of the run ``token``: daemons, task workers and the
    driver-side runners (``python -m pyspark...``), not the JVMs, whose class paths also
    name pyspark."""
    found = []
    for pid in processes_of(token):
        argv = command_line(pid).split(b"\0")
        if b"python" in os.path.basename(argv[0]) and any(
            arg.startswith(b"pyspark") for arg in argv[1:]
        ):
            found.append(pid)
    return found


def _stat(pid: int) -> tuple[str, int] | None:
    """A process's state letter and its parent's pid, from ``/proc/<pid>/stat`` (None: gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return fields[0], int(fields[1])
    except (OSError, IndexError, ValueError):
        return None


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat`` field
    22): with the pid, it names one process for good (a pid is reused, the pair is not).
    None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def java_ancestor(pid: int | None = None) -> int | None:
    """The nearest ancestor of ``pid`` (default: this process) that is a Java virtual
    machine: for a Python worker of Spark's (a data source planner, a source runner, a
    commit runner) the driver's JVM. None when there is none."""
    current = os.getpid() if pid is None else pid
    for _ in range(32):
        stat = _stat(current)
        if stat is None or stat[1] <= 1:
            return None
        current = stat[1]
        argv = command_line(current).split(b"\0")
        if argv and os.path.basename(argv[0]) == b"java":
            return current
    return None


def _parents() -> dict[int, int]:
    """Every live process (not a zombie) and its parent's pid, read from ``/proc``."""
    if not os.path.isdir("/proc"):
        return {}
    parents = {}
    for name in os.listdir("/proc"):
        stat = _stat(int(name)) if name.isdigit() else None
        if stat is not None and stat[0] not in _DEAD_STATES:
            parents[int(name)] = stat[1]
    return parents


def children_running(parent: int, module: bytes) -> list[int]:
    """The live child processes of ``parent`` whose command line names ``module`` (a Python
    module run with ``-m``): e.g. the streaming source runners a Spark driver's JVM starts."""
    return [
        pid for pid, ppid in _parents().items() if ppid == parent and module in command_line(pid)
    ]


def descendants(ancestor: int) -> dict[int, int]:
    """The live processes below ``ancestor`` in the process tree (children, theirs, ...),
    each with its parent's pid: e.g. the Python workers that PySpark's daemons forked for a
    driver."""
    parents = _parents()
    below = {}
    for pid, parent in parents.items():
        up = parent
        while up > 1 and up != ancestor:
            up = parents.get(up, 0)
        if up == ancestor and pid != ancestor:
            below[pid] = parent
    return below


_DEAD_STATES = ("Z", "X")
"""The states of a process that exited: a zombie waiting to be reaped, or dead."""


def _is_zombie(pid: int) -> bool:
    """A process that exited and waits to be reaped (it can no longer do anything)."""
    stat = _stat(pid)
    return stat is None or stat[0] in _DEAD_STATES


def kill_run(token: str, timeout: float = 10.0) -> list[int]:
    """SIGKILL every process of the run ``token`` and wait until none is left.

    Stopped processes are killed too (SIGKILL needs no SIGCONT). Returns the pids that were
    killed; raises ``TimeoutError`` if some survive ``timeout`` seconds.
    """
    killed: list[int] = []
    deadline = time.monotonic() + timeout
    while True:
        alive = processes_of(token)
        if not alive:
            return killed
        if time.monotonic() > deadline:
            raise TimeoutError(f"processes of run {token} survive SIGKILL: {alive}")
        for pid in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        # Never reap (waitpid) what we killed: a killed process that is our child belongs to
        # whoever started it (a supervisor's subprocess.Popen). Reaped here, its owner would
        # read exit status 0 (ECHILD) and take a killed driver for one that finished its job.
        # Dead processes are zombies until then, and processes_of() does not count zombies.
        time.sleep(0.02)


def signal_run(token: str, signum: int) -> list[int]:
    """Send ``signum`` to every process of the run (e.g. SIGSTOP/SIGCONT in tests)."""
    pids = processes_of(token)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)
    return pids


def die_with_parent(signum: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``signum`` to this process when its parent dies (Linux
    ``PR_SET_PDEATHSIG``). Returns False where that is not available. If the parent is
    already gone when this is called, the caller must check ``os.getppid()`` itself."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def alive(pid: int) -> bool:
    """Whether a process with this pid exists (and is not a zombie)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not _is_zombie(pid)


def scratch_dir(token: str) -> str:
    """The scratch directory of the driver run ``token``: in this process's temporary
    directory, named after the token (:data:`SCRATCH_PREFIX`)."""
    return os.path.join(tempfile.gettempdir(), SCRATCH_PREFIX + token)


def remove_scratch(token: str) -> None:
    """Remove the scratch directory of the driver run ``token``, which has ended."""
    shutil.rmtree(scratch_dir(token), ignore_errors=True)


def sweep_scratch(older_than: float = 300.0) -> list[str]:
    """Remove the scratch directories of driver runs that have no process left, which a
    killed supervisor could not remove; a directory younger than ``older_than`` seconds is
    kept (its run's driver may not have started yet). Returns the run tokens swept; sweeps
    nothing without ``/proc``, where live runs cannot be told from dead ones."""
    if not os.path.isdir("/proc"):
        return []
    base = tempfile.gettempdir()
    swept: list[str] = []
    live = _live_tokens()
    with contextlib.suppress(OSError):
        for name in os.listdir(base):
            if not name.startswith(SCRATCH_PREFIX):
                continue
            token = name[len(SCRATCH_PREFIX) :]
            try:
                age = time.time() - os.stat(os.path.join(base, name)).st_mtime
            except OSError:
                continue
            if age >= older_than and token not in live:
                remove_scratch(token)
                swept.append(token)
    return swept
