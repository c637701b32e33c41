"""Spark's checkpoint as epochal reads it (it never writes it): on local disk, on an object
store (``s3://``, through the snapshot store's client), or through ``pyarrow.fs``. Its
manifests and the verification before a restart are :mod:`epochal.state.manifests`.
"""

from __future__ import annotations

import os

from epochal.state import objectstore
from epochal.state.store import SnapshotStore


class Checkpoint:
    """Spark's checkpoint beside a run's snapshot store (``<state>/checkpoint``), as epochal
    reads it: the files of its offset and commit logs. Never written by epochal.

    Args:
        location: the checkpoint directory, local or a URI; an epoch's alias on an object
            store (``<job>/epochs/<n>/checkpoint``) means the job's shared state prefix.
    """

    def __init__(self, location: str) -> None:
        location = location.rstrip("/")
        parent, _, name = location.rpartition("/")
        self.location = f"{objectstore.shared_state_dir(parent)}/{name}" if parent else location
        self.files = SnapshotStore(self.location)

    @property
    def spark_location(self) -> str:
        """The URI Spark writes the checkpoint at (``s3a://`` on S3)."""
        return objectstore.spark_uri(self.location)

    def read(self, relative: str) -> bytes | None:
        """A file of the checkpoint (e.g. ``offsets/3``), or None when it is missing."""
        try:
            return self.files._read_raw(self.files._path(relative))
        except (FileNotFoundError, IsADirectoryError):
            return None

    def exists(self, relative: str) -> bool:
        """Whether the file exists."""
        return self.files._exists(self.files._path(relative))

    def batches(self, log: str) -> list[int]:
        """The batch ids with an entry in log ``log`` (``offsets``, ``commits``), sorted."""
        return sorted(int(name) for name in self._names(log) if name.isdigit())

    def _names(self, log: str) -> list[str]:
        path = self.files._path(log)
        if self.files.objects is not None:
            return self.files.objects.children(self.files._key(path))[0]
        if self.files.local:
            try:
                return os.listdir(path)
            except (FileNotFoundError, NotADirectoryError):
                return []
        import pyarrow.fs as pafs  # only here: a Spark worker that loads epochal skips pyarrow

        selector = pafs.FileSelector(path, allow_not_found=True)
        return [i.base_name for i in self.files._remote().get_file_info(selector)]
