"""``format("epochal.<name>")`` in any SparkSession, found by Spark itself.

PySpark 4 imports every installed top-level package named ``pyspark_*`` when a session first
uses a Python data source, and registers the ``DefaultSource`` it defines. A connector
distribution ships one such package, ``pyspark_epochal_<name>``, of two lines::

    # pyspark_epochal_jsonl/__init__.py
    from epochal_sdk import define_default_source

    define_default_source(globals(), "jsonl")

With it installed next to the runtime (``pip install epochal``), ``format("epochal.jsonl")``
works in any session, also on a Spark Connect server, without ``epochal.register(spark)``.
"""

from __future__ import annotations

import sys
from typing import Any

DEFAULT_SOURCE = "DefaultSource"
"""The name PySpark looks for in a ``pyspark_*`` package."""


def define_default_source(namespace: dict[str, Any], connector_name: str) -> None:
    """Define ``DefaultSource`` in a ``pyspark_epochal_<name>`` package: the Spark data source
    of connector ``connector_name``, ``format("epochal.<connector_name>")``.

    Spark imports the package in every session that uses Python data sources, and one
    ``pyspark_*`` package that raises hides every other one, so this never raises: without
    the runtime it defines nothing and says why on stderr (the Spark driver's log). A
    connector that is installed but fails to load is refused when a query names its format,
    with the error that stopped it.

    Args:
        namespace: the package's ``globals()``; ``DefaultSource`` is set there, as a class of
            the package (Spark pickles it by reference).
        connector_name: the connector's :attr:`~epochal_sdk.Connector.name`.
    """
    try:
        from epochal.spark.datasource import EpochalDataSource
    except Exception as exc:  # never raise here: see the docstring
        sys.stderr.write(
            f"{namespace.get('__name__', 'pyspark_epochal_' + connector_name)}: "
            f"format('epochal.{connector_name}') is not available to Spark's data source "
            f"lookup: the epochal runtime cannot be imported ({type(exc).__name__}: {exc}). "
            "Install it (pip install epochal), or call epochal.register(spark) once it works.\n"
        )
        return
    namespace[DEFAULT_SOURCE] = type(
        DEFAULT_SOURCE,
        (EpochalDataSource,),
        {
            "__module__": namespace.get("__name__", __name__),
            "__qualname__": DEFAULT_SOURCE,
            "__doc__": f'``format("epochal.{connector_name}")``: the Spark data source of the '
            f"{connector_name} connector.",
            "connector_name": connector_name,
        },
    )
