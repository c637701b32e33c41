"""The harness's server images, built on this machine: Kafka, PostgreSQL and ActiveMQ Artemis,
each from its Dockerfile in ``integration/harness/images/<server>/``, FROM a Debian base image
given as the build argument ``BASE``.

The base is ``$EPOCHAL_BASE_IMAGE`` where a registry is reachable (``debian:bookworm-slim``:
the Dockerfiles then install Java and PostgreSQL with apt), else the harness's own
(:data:`LOCAL_BASE`): a root file system made by ``debootstrap`` from the Debian mirror with
Java and PostgreSQL in it, imported with ``docker import``. Nothing is pulled from a registry
unless ``$EPOCHAL_BASE_IMAGE`` names one. Kafka's jars and Artemis's distribution come from the
harness cache (:mod:`integration.harness.cache`), as for the local servers.

Each image's tag carries a digest of what built it (its Dockerfile and entrypoint, the base,
the server's version), so a change builds a new one; the images are kept by the Docker
engine (its data root) from one run to the next::

    python -m integration.harness images          # build what is missing, say what is there
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ._process import PrerequisiteError
from .cache import artemis_home, artemis_version, kafka_classpath, kafka_version

IMAGES = Path(__file__).resolve().parent / "images"
"""The Dockerfiles and entrypoints, one directory per server."""
BASE_ENV = "EPOCHAL_BASE_IMAGE"
LOCAL_BASE = "epochal/debian-base:bookworm"
"""The harness's own base image, made by :func:`build_local_base`."""
SUITE = "bookworm"
MIRROR_ENV = "EPOCHAL_DEBIAN_MIRROR"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("openjdk-17-jre-headless", "postgresql-15", "ca-certificates")
"""What the local base holds besides Debian's minimal system: what the servers run on."""
POSTGRES_VERSION = "15"


@dataclass(frozen=True)
class ServerImage:
    """One server's image: its directory under :data:`IMAGES`, its server's version, and the
    files its build context gets from the harness cache (name in the context → source)."""

    name: str
    version: str
    context: Callable[[], dict[str, Path]]

    def tag(self, base: str) -> str:
        """``epochal/<name>:<version>-<digest of the build's inputs>``."""
        digest = hashlib.sha256(f"{base}|{self.version}".encode())
        for path in sorted((IMAGES / self.name).iterdir()):
            digest.update(path.name.encode() + path.read_bytes())
        return f"epochal/{self.name}:{self.version}-{digest.hexdigest()[:12]}"


SERVERS = {
    "kafka": ServerImage("kafka", kafka_version(), lambda: {"libs": kafka_classpath()}),
    "postgres": ServerImage("postgres", POSTGRES_VERSION, dict),
    "artemis": ServerImage("artemis", artemis_version(), lambda: {"artemis": artemis_home()}),
}


def docker() -> str:
    """The ``docker`` command line client."""
    found = shutil.which("docker")
    if found is None:
        raise PrerequisiteError(
            "the harness's containers need Docker's client and engine: apt-get install docker.io"
        )
    return found


def _docker(*args: str, timeout: float = 600, stdin: bytes | None = None) -> str:
    done = subprocess.run(
        [docker(), *args], input=stdin, capture_output=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise PrerequisiteError(
            f"docker {' '.join(args[:2])} failed: {done.stderr.decode(errors='replace')[-2000:]}"
        )
    return done.stdout.decode(errors="replace")


def image_exists(tag: str) -> bool:
    """Whether the engine holds an image of this tag."""
    found = subprocess.run(
        [docker(), "image", "inspect", tag], capture_output=True, timeout=60, check=False
    )
    return found.returncode == 0


def base_image(report: Callable[[str], None] = print) -> str:
    """The base image: ``$EPOCHAL_BASE_IMAGE`` (pulled by the build when a registry has it),
    else the harness's own, made now if the engine lacks it."""
    named = os.environ.get(BASE_ENV, "").strip()
    if named:
        return named
    if not image_exists(LOCAL_BASE):
        build_local_base(report)
    return LOCAL_BASE


def build_local_base(report: Callable[[str], None] = print) -> None:
    """Make :data:`LOCAL_BASE`: ``debootstrap`` a minimal Debian with :data:`PACKAGES` from
    the mirror (``$EPOCHAL_DEBIAN_MIRROR``), then ``docker import`` it."""
    debootstrap = shutil.which("debootstrap") or (
        "/usr/sbin/debootstrap" if os.path.exists("/usr/sbin/debootstrap") else None
    )
    if debootstrap is None:
        raise PrerequisiteError(
            f"the harness's server images need a Debian base image, and no registry is "
            f"used: install debootstrap (apt-get install debootstrap) to make {LOCAL_BASE} "
            f"from the Debian mirror, or set {BASE_ENV}=debian:bookworm-slim where a registry "
            "is reachable; then run: python -m integration.harness images"
        )
    mirror = os.environ.get(MIRROR_ENV, MIRROR)
    report(f"making {LOCAL_BASE}: debootstrap {SUITE} from {mirror} with {', '.join(PACKAGES)}")
    with tempfile.TemporaryDirectory(prefix="epochal-base-") as work:
        root = Path(work) / "root"
        done = subprocess.run(
            [
                debootstrap,
                "--variant=minbase",
                f"--include={','.join(PACKAGES)}",
                SUITE,
                str(root),
                mirror,
            ],
            capture_output=True,
            timeout=1800,
            check=False,
        )
        if done.returncode != 0:
            raise PrerequisiteError(
                f"debootstrap failed (it needs root and the Debian mirror {mirror}): "
                f"{done.stdout.decode(errors='replace')[-2000:]}"
            )
        for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for path in (root / leftover).glob("*"):
                if path.is_file():
                    path.unlink()
        archive = subprocess.run(
            ["tar", "-C", str(root), "-c", "."], capture_output=True, timeout=600, check=True
        ).stdout
        _docker("import", "-", LOCAL_BASE, stdin=archive)


def ensure(name: str, report: Callable[[str], None] = print) -> str:
    """The tag of server ``name``'s image, built now if the engine lacks it."""
    server = SERVERS[name]
    base = base_image(report)
    tag = server.tag(base)
    if image_exists(tag):
        return tag
    report(f"building {tag} FROM {base}")
    with tempfile.TemporaryDirectory(prefix=f"epochal-image-{name}-") as work:
        context = Path(work)
        for path in (IMAGES / name).iterdir():
            shutil.copy2(path, context / path.name)
        for inside, source in server.context().items():
            shutil.copytree(source, context / inside, symlinks=True)
        try:
            _docker("build", "-q", "--build-arg", f"BASE={base}", "-t", tag, str(context))
        except PrerequisiteError as exc:
            if base == LOCAL_BASE:
                raise
            raise PrerequisiteError(
                f"{exc}\nthe base image {base} (${BASE_ENV}) may come from a registry this "
                f"machine cannot reach: unset {BASE_ENV} to build on the harness's own base "
                f"({LOCAL_BASE}, made by debootstrap from the Debian mirror), then run: "
                "python -m integration.harness images"
            ) from None
    return tag


def ensure_all(report: Callable[[str], None] = print) -> dict[str, str]:
    """Every server image, built where missing: name → tag."""
    return {name: ensure(name, report) for name in SERVERS}
