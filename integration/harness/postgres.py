"""PostgreSQL for integration tests: a private cluster made with the Debian server binaries.

``initdb`` creates the cluster in a temporary directory (as the unprivileged ``postgres``
user when the harness runs as root, since PostgreSQL refuses to run as root); ``postgres``
then listens on a free loopback port with its unix socket inside the temporary directory
and ``max_prepared_transactions`` set, so two-phase commit works.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from ._process import (
    HOST,
    HarnessError,
    ManagedProcess,
    PrerequisiteError,
    free_port,
    make_temp_dir,
    port_open,
    run_checked,
    wait_until,
)
from .server import ExternalBackend, LocalBackend, Server

SUPERUSER = "epochal"
PASSWORD = "epochal"
MAX_PREPARED_TRANSACTIONS = 256
"""Room for a 2PC job of 32+ partitions: a transaction per task of a batch, prepared ones
of a batch in doubt beside the next batch's (the soak at 32 partitions)."""
INSTALL_HINT = "the PostgreSQL server (Debian: apt-get install postgresql)"


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError as exc:
        raise PrerequisiteError(
            "the PostgreSQL fixtures need psycopg 3: pip install 'psycopg[binary]'"
        ) from exc
    return psycopg


def find_bindir() -> Path:
    """The directory of ``initdb``/``postgres`` (``$EPOCHAL_PG_BINDIR`` or newest Debian one)."""
    explicit = os.environ.get("EPOCHAL_PG_BINDIR")
    candidates = [explicit] if explicit else []
    candidates += sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]), reverse=True
    )
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(str(Path(initdb).resolve().parent))
    for candidate in candidates:
        if (Path(candidate) / "initdb").exists() and (Path(candidate) / "postgres").exists():
            return Path(candidate)
    raise PrerequisiteError(
        f"PostgreSQL server binaries (initdb, postgres) not found: install {INSTALL_HINT}"
    )


def _run_user() -> str | None:
    """The user to run PostgreSQL as: ``postgres`` when we are root, else ourselves."""
    if os.geteuid() != 0:
        return None
    name = os.environ.get("EPOCHAL_PG_OS_USER", "postgres")
    try:
        pwd.getpwnam(name)
    except KeyError as exc:
        raise PrerequisiteError(
            f"running as root, PostgreSQL needs an unprivileged OS user '{name}' "
            f"(created by {INSTALL_HINT}; or set EPOCHAL_PG_OS_USER)"
        ) from exc
    return name


def make_dsn(host: str, port: int, user: str, password: str, dbname: str) -> str:
    """A ``postgresql://`` URL for libpq/psycopg."""
    return f"postgresql://{quote(user)}:{quote(password)}@{host}:{port}/{quote(dbname)}"


def postgres_ready(dsn: str, timeout: float = 3.0) -> bool:
    """One readiness probe: connect and ``SELECT 1``."""
    psycopg = _psycopg()
    with psycopg.connect(dsn, connect_timeout=max(1, int(timeout)), autocommit=True) as conn:
        return conn.execute("SELECT 1").fetchone() == (1,)


class LocalPostgres(LocalBackend):
    """A PostgreSQL cluster (``initdb``) and its ``postgres`` process in a temporary directory."""

    start_timeout = 60.0

    def __init__(
        self, name: str = "postgres", max_prepared_transactions: int = MAX_PREPARED_TRANSACTIONS
    ) -> None:
        """``max_prepared_transactions``: 0 makes a server without two-phase commit."""
        bindir = find_bindir()
        user = _run_user()
        workdir = make_temp_dir("epochal-postgres-", owner=user)
        datadir, sockdir = workdir / "data", workdir / "sock"
        sockdir.mkdir()
        pwfile = workdir / "pwfile"
        pwfile.write_text(PASSWORD + "\n")
        if user:
            for path in (sockdir, pwfile):
                shutil.chown(path, user=user, group=user)
        run_checked(
            [str(bindir / "initdb"), "-D", str(datadir), f"--pwfile={pwfile}", *_initdb_options()],
            "initdb",
            timeout=120,
            user=user,
            cwd=workdir,
        )
        pwfile.unlink()
        self.port = free_port()
        settings = {
            "listen_addresses": HOST,
            "port": str(self.port),
            "unix_socket_directories": str(sockdir),
            "max_prepared_transactions": str(max_prepared_transactions),
            "max_connections": "200",
            "shared_buffers": "64MB",
            "logging_collector": "off",
            "log_min_messages": "warning",
        }
        argv = [str(bindir / "postgres"), "-D", str(datadir)]
        for key, value in settings.items():
            argv += ["-c", f"{key}={value}"]
        process = ManagedProcess(
            name=name,
            argv=argv,
            log_path=workdir / "server.log",
            cwd=workdir,
            user=user,
            stop_signal=signal.SIGINT,  # "fast" shutdown: do not wait for clients
            stop_timeout=30,
        )
        super().__init__(name, workdir, process)

    @property
    def dsn(self) -> str:
        """Superuser DSN of the ``postgres`` database."""
        return make_dsn(HOST, self.port, SUPERUSER, PASSWORD, "postgres")

    def probe(self) -> bool:
        """Port open and ``SELECT 1`` succeeds."""
        return port_open(HOST, self.port) and postgres_ready(self.dsn)


def _initdb_options() -> list[str]:
    """Superuser with a password over TCP (scram), trust on the private unix socket."""
    locale = "--locale=C.UTF-8" if _has_c_utf8() else "--no-locale"
    return [
        "-U",
        SUPERUSER,
        "--auth-local=trust",
        "--auth-host=scram-sha-256",
        "-E",
        "UTF8",
        "--no-sync",
        locale,
    ]


def _has_c_utf8() -> bool:
    return os.path.isdir("/usr/lib/locale/C.utf8") or os.path.isdir("/usr/lib/locale/C.UTF-8")


@dataclass
class PostgresServer(Server):
    """Connection info and controls of the PostgreSQL server provided by ``postgres_server``."""

    host: str = HOST
    port: int = 0
    user: str = SUPERUSER
    password: str = PASSWORD
    dbname: str = "postgres"
    version: str = ""

    @property
    def dsn(self) -> str:
        """Superuser DSN (URL form) of the maintenance database."""
        return self.dsn_for(self.dbname)

    def dsn_for(self, dbname: str) -> str:
        """Superuser DSN (URL form) of database ``dbname`` on this server."""
        return make_dsn(self.host, self.port, self.user, self.password, dbname)

    def connect(self, dbname: str | None = None, **kwargs: Any) -> Any:
        """A new psycopg connection (autocommit unless given) to ``dbname``."""
        psycopg = _psycopg()
        kwargs.setdefault("autocommit", True)
        return psycopg.connect(self.dsn_for(dbname or self.dbname), **kwargs)

    def create_database(self, name: str) -> str:
        """``CREATE DATABASE``; return its DSN."""
        psycopg = _psycopg()
        with self.connect() as conn:
            conn.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name)))
        return self.dsn_for(name)

    def drop_database(self, name: str) -> None:
        """Roll back its prepared transactions, then ``DROP DATABASE ... WITH (FORCE)``."""
        psycopg = _psycopg()
        with self.connect() as conn:
            gids = conn.execute(
                "SELECT gid FROM pg_prepared_xacts WHERE database = %s", (name,)
            ).fetchall()
        if gids:
            with self.connect(name) as conn:
                for (gid,) in gids:
                    with contextlib.suppress(psycopg.Error):
                        conn.execute(
                            psycopg.sql.SQL("ROLLBACK PREPARED {}").format(psycopg.sql.Literal(gid))
                        )
        with self.connect() as conn:
            statement = "DROP DATABASE IF EXISTS {} WITH (FORCE)"
            conn.execute(psycopg.sql.SQL(statement).format(psycopg.sql.Identifier(name)))


def _parse_external(dsn: str) -> dict[str, Any]:
    psycopg = _psycopg()
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    if dsn.startswith(("postgres://", "postgresql://")):
        parts = urlsplit(dsn)
        info.setdefault("host", parts.hostname)
        info.setdefault("port", parts.port)
    return {
        "host": str(info.get("host") or "127.0.0.1"),
        "port": int(info.get("port") or 5432),
        "user": str(info.get("user") or "postgres"),
        "password": str(info.get("password") or ""),
        "dbname": str(info.get("dbname") or "postgres"),
    }


def start_postgres() -> PostgresServer:
    """Provide PostgreSQL: ``$EPOCHAL_POSTGRES_DSN``, else a container, else a local cluster."""
    external = os.environ.get("EPOCHAL_POSTGRES_DSN")
    if external:
        wait_until(lambda: postgres_ready(external), 60, "PostgreSQL at EPOCHAL_POSTGRES_DSN")
        backend = ExternalBackend("postgres", "EPOCHAL_POSTGRES_DSN")
        return PostgresServer(backend, version="external", **_parse_external(external))
    from .containers import docker_available, start_postgres_container

    if docker_available():
        container_backend, dsn = start_postgres_container()
        wait_until(lambda: postgres_ready(dsn), 120, "PostgreSQL container")
        return PostgresServer(container_backend, version="container", **_parse_external(dsn))
    local = LocalPostgres()
    try:
        local.start()
    except HarnessError:
        local.close()
        raise
    with _psycopg().connect(local.dsn) as conn:
        version = str(conn.execute("SHOW server_version").fetchone()[0])
    return PostgresServer(local, port=local.port, version=version)
