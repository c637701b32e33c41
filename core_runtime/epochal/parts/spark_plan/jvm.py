"""The py4j side of the reader: the look-ups it makes in a classic SparkSession's JVM
(:class:`Jvm`), private fields and Scala maps read by reflection, and the error raised when a
query's plan cannot be read from this process (:class:`UnreadablePlanError`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

_DATA_SOURCE_REGISTER = "org.apache.spark.sql.sources.DataSourceRegister"


class UnreadablePlanError(Exception):
    """The query's plan cannot be read from this process: a Spark Connect writer (its plan is
    on the Connect server), or a writer whose JVM objects do not look like Spark 4.3's."""


class Jvm:
    """The JVM side of a classic SparkSession, and the look-ups the reader makes there."""

    def __init__(self, spark: Any) -> None:
        self.jvm = spark._jvm
        self.gateway = spark.sparkContext._gateway
        self.session = spark._jsparkSession
        self.conf = self.session.sessionState().conf()

    def java_class(self, name: str) -> Any:
        """The JVM class ``name`` (``java.lang.Class.forName``)."""
        return self.jvm.java.lang.Class.forName(name)

    def is_a(self, cls: Any, names: Sequence[str]) -> bool:
        """Whether the JVM class ``cls`` is (a subclass of) one of the classes ``names``."""
        return any(self.java_class(name).isAssignableFrom(cls) for name in names)

    def provider_class(self, name: str) -> Any | None:
        """The class Spark uses for ``format(name)``, or None where Spark finds none."""
        try:
            return self.jvm.org.apache.spark.sql.execution.datasources.DataSource.lookupDataSource(
                name, self.conf
            )
        except Exception:  # Py4JJavaError: no such data source here
            return None

    def short_name(self, provider: Any) -> str | None:
        """A provider instance's ``DataSourceRegister.shortName()``, if it has one."""
        if self.java_class(_DATA_SOURCE_REGISTER).isInstance(provider):
            return str(provider.shortName())
        return None

    def short_name_of_class(self, cls: Any) -> str | None:
        """The short name of a provider class (Spark creates providers the same way)."""
        if not self.java_class(_DATA_SOURCE_REGISTER).isAssignableFrom(cls):
            return None
        no_classes = self.gateway.new_array(self.jvm.java.lang.Class, 0)
        no_arguments = self.gateway.new_array(self.jvm.java.lang.Object, 0)
        try:
            return str(cls.getDeclaredConstructor(no_classes).newInstance(no_arguments).shortName())
        except Exception:  # no constructor without arguments: Spark could not create it either
            return None

    def python_data_source(self, name: str) -> Any | None:
        """The session's Python data source ``name`` (a ``UserDefinedPythonDataSource``)."""
        manager = self.session.sessionState().dataSourceManager()
        return manager.lookupDataSource(name) if manager.dataSourceExists(name) else None


def private_field(obj: Any, name: str) -> Any:
    """The value of a JVM object's private field, by Java reflection."""
    cls = obj.getClass()
    while cls is not None:
        for field in cls.getDeclaredFields():
            if field.getName() == name:
                field.setAccessible(True)
                return field.get(obj)
        cls = cls.getSuperclass()
    raise UnreadablePlanError(
        f"{obj.getClass().getName()} has no field {name!r}: this reader knows Spark 4.3's "
        "classic DataStreamWriter"
    )


def scala_map(value: Any) -> dict[str, str]:
    """A Scala ``Map[String, String]`` (a ``CaseInsensitiveMap`` too) as a dict."""
    result = {}
    iterator = value.iterator()
    while iterator.hasNext():
        pair = iterator.next()
        result[str(pair._1())] = str(pair._2())
    return result
