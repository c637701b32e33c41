"""The harness's containers (integration.harness.containers and .images), where a Docker engine
answers: a container's server is killed, frozen and comes back at the same address; a container
whose harness process is gone is swept; a base image from an unreachable registry fails with a
message that says what to do. (Without an engine these skip: the servers are local processes,
tested by integration/test_local_servers.py.)"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

import pytest

from integration.harness import images
from integration.harness._process import PrerequisiteError
from integration.harness.containers import (
    OWNER_LABEL,
    docker_available,
    start_postgres_container,
    sweep,
)
from integration.harness.postgres import postgres_ready

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not docker_available(), reason="no Docker engine: the servers run as local processes"
    ),
]


def _answers(dsn: str) -> bool:
    try:
        return bool(postgres_ready(dsn))
    except Exception:  # a frozen or stopped server: the probe times out or is refused
        return False


def test_a_container_is_killed_frozen_and_comes_back_at_the_same_address() -> None:
    backend, dsn = start_postgres_container()
    try:
        assert _answers(dsn)
        backend.kill()
        assert not backend.is_running()
        assert not _answers(dsn)
        backend.start()
        assert _answers(dsn), "the restarted container does not answer at its old address"
        backend.pause()
        assert not backend.is_running()
        assert not _answers(dsn), "a paused container's server answered"
        backend.unpause()
        backend.wait_ready()
        assert _answers(dsn)
    finally:
        backend.close()


def test_a_container_whose_harness_is_gone_is_swept() -> None:
    import docker

    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    dead_owner = int(gone.stdout)
    client = docker.from_env()
    orphan = client.containers.create(
        images.base_image(), command=["true"], labels={OWNER_LABEL: str(dead_owner)}
    )
    mine = client.containers.create(
        images.base_image(), command=["true"], labels={OWNER_LABEL: str(os.getpid())}
    )
    try:
        sweep()
        left = {c.id for c in client.containers.list(all=True, filters={"label": OWNER_LABEL})}
        assert orphan.id not in left, "a dead harness's container was left"
        assert mine.id in left, "a live harness's container was removed"
    finally:
        for container in (orphan, mine):
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True)


def test_a_base_image_from_an_unreachable_registry_says_what_to_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(images.BASE_ENV, "registry.invalid/debian:bookworm-slim")
    with pytest.raises(PrerequisiteError) as refused:
        images.ensure("postgres", report=lambda _line: None)
    message = str(refused.value)
    assert f"unset {images.BASE_ENV}" in message
    assert images.LOCAL_BASE in message
    assert "python -m integration.harness images" in message
