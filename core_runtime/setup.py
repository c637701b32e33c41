"""The build's one addition to pyproject.toml: ``epochal-attach.pth`` at the root of the wheel
(pip puts it in site-packages), so that a plain SparkSession's first streaming query gets the
session check without ``epochal.register`` (:mod:`epochal.spark.attach`)."""

from __future__ import annotations

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "epochal-attach.pth"


class BuildWithAttach(build_py):
    """``build_py``, then the ``.pth`` file beside the packages."""

    def run(self) -> None:
        super().run()
        here = os.path.dirname(os.path.abspath(__file__))
        self.copy_file(os.path.join(here, PTH), os.path.join(self.build_lib, PTH))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), os.path.join(self.build_lib, PTH)]


setup(cmdclass={"build_py": BuildWithAttach})
