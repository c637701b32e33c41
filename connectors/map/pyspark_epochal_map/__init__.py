"""Spark-native discovery of ``format("epochal.map")``.

PySpark 4 imports every installed top-level package named ``pyspark_*`` when a session
first uses a Python data source, and registers the ``DefaultSource`` it defines. With
epochal-map installed next to epochal (the runtime), ``spark.readStream.format("epochal.map")``
and ``writeStream.format("epochal.map")`` therefore work in any SparkSession, also on a
Spark Connect server, without ``epochal.register(spark)``. See docs/spark-connect.md.

Spark imports this package in every session that uses Python data sources, and one failing
``pyspark_*`` package would hide every other one, so it never raises: without the runtime it
defines nothing and says why on stderr (the Spark driver's log).
"""

from __future__ import annotations

import sys

try:
    from epochal.spark.datasource import EpochalDataSource
except Exception as _exc:  # never raise here: see the module docstring
    sys.stderr.write(
        f"epochal-map: format('epochal.map') is not available to Spark's data source lookup: "
        f"the epochal runtime cannot be imported ({type(_exc).__name__}: {_exc}). "
        "Install it (pip install epochal), or call epochal.register(spark) once it works.\n"
    )
else:

    class DefaultSource(EpochalDataSource):
        """``format("epochal.map")``: the Spark data source of the map connector."""

        connector_name = "map"
