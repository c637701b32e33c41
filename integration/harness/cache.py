"""Download cache for the servers' binaries: Kafka, Artemis, Hadoop (YARN, HDFS, S3A) jars.

They come from Maven Central through ``mvn`` (its local repository lives inside the cache
directory too). The cache directory is ``$EPOCHAL_CACHE_DIR`` or
``~/.cache/epochal-integration``; an entry is complete once its ``.complete`` marker exists,
so a second run does no network work. A file lock serialises concurrent fetches.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

from ._process import HarnessError, PrerequisiteError, run_checked

#: Newest Kafka 4.x whose artifacts (including kafka-tools-api) all resolve from Central.
KAFKA_VERSION = "4.3.1"
#: Newest Artemis release with a ``bin`` distribution on Central (group org.apache.artemis).
ARTEMIS_VERSION = "2.56.0"
LOG4J_VERSION = "2.24.3"
DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.6.1"
ARTEMIS_GROUPS = ("org.apache.artemis", "org.apache.activemq")
MAVEN_TIMEOUT = 1200.0

_KAFKA_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>epochal.integration</groupId>
  <artifactId>kafka-broker-classpath</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId>
      <version>{kafka}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId><artifactId>log4j-core</artifactId>
      <version>{log4j}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId><artifactId>log4j-slf4j-impl</artifactId>
      <version>{log4j}</version>
    </dependency>
  </dependencies>
</project>
"""


def kafka_version() -> str:
    """The Kafka version to run (``$EPOCHAL_KAFKA_VERSION`` or :data:`KAFKA_VERSION`)."""
    return os.environ.get("EPOCHAL_KAFKA_VERSION", KAFKA_VERSION)


def artemis_version() -> str:
    """The Artemis version to run (``$EPOCHAL_ARTEMIS_VERSION`` or :data:`ARTEMIS_VERSION`)."""
    return os.environ.get("EPOCHAL_ARTEMIS_VERSION", ARTEMIS_VERSION)


def cache_dir() -> Path:
    """The cache directory (created if missing)."""
    default = Path.home() / ".cache" / "epochal-integration"
    path = Path(os.environ.get("EPOCHAL_CACHE_DIR", str(default))).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    return path


def require_tool(name: str, install_hint: str) -> str:
    """Return the path of executable ``name`` or raise :class:`PrerequisiteError`."""
    found = shutil.which(name)
    if found is None:
        raise PrerequisiteError(f"'{name}' not found on PATH: install {install_hint}")
    return found


def require_java() -> str:
    """The ``java`` executable (JDK/JRE 17 or newer is needed by Kafka 4 and Artemis)."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return str(Path(java_home) / "bin" / "java")
    return require_tool(
        "java", "a Java 17+ runtime (Debian: apt-get install openjdk-17-jre-headless)"
    )


def require_maven() -> str:
    """The ``mvn`` executable, used to fetch jars from Maven Central."""
    return require_tool("mvn", "Apache Maven (Debian: apt-get install maven)")


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock file next to a cache entry while it is being built."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _mvn(args: list[str], what: str, cwd: Path) -> None:
    mvn = require_maven()
    repo = cache_dir() / "m2"
    cmd = [mvn, "-B", "-q", "-Dstyle.color=never", f"-Dmaven.repo.local={repo}", *args]
    try:
        run_checked(cmd, what, timeout=MAVEN_TIMEOUT, cwd=cwd)
    except PrerequisiteError:
        raise
    except HarnessError as exc:
        reasons = [line for line in str(exc).splitlines() if "Failed to execute" in line]
        detail = "\n".join(reasons).replace("\x1b[0m", "") or str(exc)
        raise PrerequisiteError(
            f"{what}: Maven could not fetch it from Maven Central (network down? version "
            f"not published?): {' '.join(cmd)}\n{detail}"
        ) from None


def kafka_classpath(version: str | None = None) -> Path:
    """Directory holding the Kafka broker's jars (fetched with Maven on first use)."""
    version = version or kafka_version()
    entry = cache_dir() / f"kafka-{version}"
    libs = entry / "libs"
    marker = entry / ".complete"
    if marker.exists():
        return libs
    require_java()
    with _locked(entry):
        if marker.exists():
            return libs
        shutil.rmtree(entry, ignore_errors=True)
        entry.mkdir(parents=True)
        (entry / "pom.xml").write_text(_KAFKA_POM.format(kafka=version, log4j=LOG4J_VERSION))
        _mvn(
            [
                f"{DEPENDENCY_PLUGIN}:copy-dependencies",
                f"-DoutputDirectory={libs}",
                "-DincludeScope=runtime",
            ],
            f"fetching Kafka {version} jars",
            entry,
        )
        if not any(libs.glob("kafka_2.13-*.jar")):
            raise PrerequisiteError(f"Kafka {version}: no kafka_2.13 jar was fetched into {libs}")
        marker.write_text(version + "\n")
    return libs


def artemis_home(version: str | None = None) -> Path:
    """The unpacked Artemis distribution (``bin/artemis`` inside), fetched on first use."""
    version = version or artemis_version()
    entry = cache_dir() / f"artemis-{version}"
    home = entry / f"apache-artemis-{version}"
    marker = entry / ".complete"
    if marker.exists():
        return home
    require_java()
    with _locked(entry):
        if marker.exists():
            return home
        shutil.rmtree(entry, ignore_errors=True)
        entry.mkdir(parents=True)
        archive = _fetch_artemis_archive(version, entry)
        _extract(archive, entry)
        archive.unlink()
        if not (home / "bin" / "artemis").exists():
            raise PrerequisiteError(f"Artemis {version}: {home}/bin/artemis missing after unpack")
        marker.write_text(version + "\n")
    return home


def _fetch_artemis_archive(version: str, entry: Path) -> Path:
    errors: list[str] = []
    for group in ARTEMIS_GROUPS:
        try:
            _mvn(
                [
                    f"{DEPENDENCY_PLUGIN}:copy",
                    f"-Dartifact={group}:apache-artemis:{version}:tar.gz:bin",
                    f"-DoutputDirectory={entry}",
                ],
                f"fetching Artemis {version} ({group})",
                entry,
            )
        except PrerequisiteError as exc:
            errors.append(str(exc)[-600:])
            continue
        return entry / f"apache-artemis-{version}-bin.tar.gz"
    raise PrerequisiteError(
        f"could not fetch the Artemis {version} distribution:\n" + "\n".join(errors)
    )


def _extract(archive: Path, dest: Path) -> None:
    with tempfile.TemporaryDirectory(dir=dest) as tmp, tarfile.open(archive) as tar:
        tar.extractall(tmp, filter="tar")
        for child in Path(tmp).iterdir():
            child.rename(dest / child.name)
    for script in (dest).glob("apache-artemis-*/bin/*"):
        script.chmod(script.stat().st_mode | 0o755)


def prefetch(kafka: bool = True, artemis: bool = True) -> dict[str, Path]:
    """Fetch everything the local servers need into the cache; return what is where."""
    fetched: dict[str, Path] = {}
    if kafka:
        fetched[f"kafka {kafka_version()}"] = kafka_classpath()
    if artemis:
        fetched[f"artemis {artemis_version()}"] = artemis_home()
    return fetched


# --- Spark: the pyspark distribution, and the S3A connector (hadoop-aws) ------------------

#: hadoop-aws and the AWS SDK v2 ``bundle`` it was built against (plus its runtime
#: dependencies), resolved by Maven from hadoop-aws's own POM, so the SDK version always
#: matches the Hadoop release (Hadoop 3.5.0: bundle 2.35.4, analyticsaccelerator-s3 1.3.1).
_HADOOP_AWS_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>epochal.integration</groupId>
  <artifactId>hadoop-aws-classpath</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.hadoop</groupId><artifactId>hadoop-aws</artifactId>
      <version>{hadoop}</version>
    </dependency>
  </dependencies>
</project>
"""


PYSPARK_BUILD_TIMEOUT = 1800.0
"""Seconds pip may take to fetch and build one pyspark release's wheel."""


def pyspark_wheelhouse(*releases: str) -> Path:
    """A directory of pyspark wheels, one per release in ``releases`` (``--find-links``
    for the environments of other releases). PyPI ships pyspark as a source archive of
    ~400 MB that pip builds into a wheel whenever its own cache lacks it; here each release
    is fetched and built once into the harness cache (``wheels/``), which CI machines keep,
    so an environment's ``pip install pyspark==<release>`` then finds the wheel at once."""
    wheels = cache_dir() / "wheels"
    wheels.mkdir(exist_ok=True)
    for release in releases:
        if _pyspark_wheel(wheels, release) is not None:
            continue
        with _locked(wheels / f"pyspark-{release}"):
            if _pyspark_wheel(wheels, release) is not None:
                continue
            with tempfile.TemporaryDirectory(dir=wheels, prefix=".building-") as building:
                cmd = [
                    sys.executable,
                    *("-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps"),
                    *("--retries", "10", "--timeout", "60"),  # a slow mirror: wait, retry
                    *("-w", building, f"pyspark=={release}"),
                ]
                what = f"fetching and building pyspark {release}'s wheel"
                run_checked(cmd, what, timeout=PYSPARK_BUILD_TIMEOUT)
                (built,) = Path(building).glob("pyspark-*.whl")
                os.replace(built, wheels / built.name)  # whole, or not there
    return wheels


def _pyspark_wheel(wheels: Path, release: str) -> Path | None:
    found = sorted(wheels.glob(f"pyspark-{release}-*.whl"))
    return found[0] if found else None


def pyspark_home() -> Path:
    """The installed pyspark package directory (it is a Spark distribution: ``jars/``, ``bin/``)."""
    try:
        import pyspark
    except ImportError as exc:
        raise PrerequisiteError("Spark fixtures need pyspark: pip install pyspark") from exc
    home = Path(pyspark.__file__).resolve().parent
    if not (home / "jars").is_dir():
        raise PrerequisiteError(f"pyspark at {home} has no jars/ directory (a broken install?)")
    return home


def pyspark_hadoop_version() -> str:
    """The Hadoop version bundled with pyspark, read from ``jars/hadoop-client-api-<v>.jar``."""
    jars = sorted((pyspark_home() / "jars").glob("hadoop-client-api-*.jar"))
    if not jars:
        raise PrerequisiteError(f"no hadoop-client-api-*.jar in {pyspark_home() / 'jars'}")
    return jars[-1].name.removeprefix("hadoop-client-api-").removesuffix(".jar")


def hadoop_aws_version() -> str:
    """The hadoop-aws version (``$EPOCHAL_HADOOP_AWS_VERSION`` or pyspark's Hadoop version).

    hadoop-aws must match the Hadoop jars Spark runs with: it uses Hadoop's internal APIs.
    """
    return os.environ.get("EPOCHAL_HADOOP_AWS_VERSION") or pyspark_hadoop_version()


def hadoop_aws_jars(version: str | None = None) -> list[Path]:
    """The jars of hadoop-aws ``version`` and its runtime dependencies, fetched on first use
    (:func:`_resolved_classpath`: the AWS SDK bundle alone is ~690 MB, so it is not copied a
    second time)."""
    version = version or hadoop_aws_version()
    return _resolved_classpath(
        f"hadoop-aws-{version}",
        _HADOOP_AWS_POM.format(hadoop=version),
        "hadoop-aws-",
        f"fetching hadoop-aws {version} and the AWS SDK bundle",
    )


DELTA_VERSION = "4.4.0"
"""Delta Lake's release for Spark 4.2 (``delta-spark_4.2_2.13``), the newest Spark it
publishes for."""
DELTA_SPARK = "4.2"
"""The Spark release :data:`DELTA_VERSION` is built for."""
DELTA_PYSPARK = f"{DELTA_SPARK}.1"
"""The newest pyspark of :data:`DELTA_SPARK`: the Delta tests' environment."""

_ONE_ARTIFACT_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>epochal.integration</groupId>
  <artifactId>{artifact}-classpath</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>{group}</groupId><artifactId>{artifact}</artifactId>
      <version>{version}</version>
    </dependency>
  </dependencies>
</project>
"""
"""A pom of one dependency (``group``, ``artifact``, ``version``), for its class path."""


def delta_jars(version: str = DELTA_VERSION, spark: str = DELTA_SPARK) -> list[Path]:
    """The jars of Delta Lake ``version`` for Spark ``spark`` that a session adds
    (``spark.jars``): delta-spark and delta-storage, fetched from Maven Central on first use.
    The rest of their class path (Scala, Hadoop, Jackson, Parquet) is Spark's own, in the
    release's versions."""
    resolved = _resolved_classpath(
        f"delta-{version}-spark-{spark}",
        _ONE_ARTIFACT_POM.format(
            group="io.delta", artifact=f"delta-spark_{spark}_2.13", version=version
        ),
        "delta-spark_",
        f"fetching Delta Lake {version} for Spark {spark}",
    )
    return [p for p in resolved if p.name.startswith(("delta-spark_", "delta-storage-"))]


ICEBERG_VERSION = "1.12.0"
"""Apache Iceberg's release for Spark 4.1 (``iceberg-spark-runtime-4.1_2.13``), the newest
Spark it publishes for."""
ICEBERG_SPARK = "4.1"
"""The Spark release :data:`ICEBERG_VERSION` is built for."""
ICEBERG_PYSPARK = f"{ICEBERG_SPARK}.4"
"""The newest pyspark of :data:`ICEBERG_SPARK`: the Iceberg tests' environment."""


def iceberg_jars(version: str = ICEBERG_VERSION, spark: str = ICEBERG_SPARK) -> list[Path]:
    """Iceberg's Spark runtime ``version`` for Spark ``spark``: one jar with everything it
    needs besides Spark, fetched from Maven Central on first use."""
    resolved = _resolved_classpath(
        f"iceberg-{version}-spark-{spark}",
        _ONE_ARTIFACT_POM.format(
            group="org.apache.iceberg",
            artifact=f"iceberg-spark-runtime-{spark}_2.13",
            version=version,
        ),
        "iceberg-spark-runtime-",
        f"fetching Iceberg {version} for Spark {spark}",
    )
    return [p for p in resolved if p.name.startswith("iceberg-spark-runtime-")]


def _resolved_classpath(name: str, pom: str, must_have: str, what: str) -> list[Path]:
    """The runtime class path of ``pom``'s dependencies, resolved by Maven into the cache's
    local repository (``m2/``) once; the cache entry ``name`` keeps only the list of jars.
    ``must_have`` starts the name of a jar the class path must hold."""
    entry = cache_dir() / name
    listing = entry / "classpath.txt"
    marker = entry / ".complete"

    def jars() -> list[Path] | None:
        if not marker.exists():
            return None
        paths = [Path(p) for p in listing.read_text().strip().split(os.pathsep) if p]
        return paths if paths and all(p.is_file() for p in paths) else None

    found = jars()
    if found:
        return found
    require_java()
    with _locked(entry):
        found = jars()
        if found:
            return found
        shutil.rmtree(entry, ignore_errors=True)
        entry.mkdir(parents=True)
        (entry / "pom.xml").write_text(pom)
        _mvn(
            [
                f"{DEPENDENCY_PLUGIN}:build-classpath",
                f"-Dmdep.outputFile={listing}",
                "-DincludeScope=runtime",
            ],
            what,
            entry,
        )
        paths = [Path(p) for p in listing.read_text().strip().split(os.pathsep) if p]
        if not any(p.name.startswith(must_have) for p in paths):
            raise PrerequisiteError(f"{name}: no {must_have}* jar in the class path {paths}")
        marker.write_text(name + "\n")
    return paths


# --- Hadoop daemons: YARN (integration.harness.yarn) and HDFS (integration.harness.hdfs) -----

#: A pom whose dependencies are the daemons' artifacts; Maven copies their runtime class path.
_HADOOP_DAEMONS_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>epochal.integration</groupId>
  <artifactId>hadoop-{kind}-classpath</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>{dependencies}
  </dependencies>
</project>
"""
#: The YARN daemons, hadoop-common and hadoop-hdfs-client, with their runtime dependencies
#: (Hadoop 3.5.0 logs through slf4j-reload4j, which hadoop-common brings along).
_HADOOP_YARN_ARTIFACTS = (
    "hadoop-yarn-server-resourcemanager",
    "hadoop-yarn-server-nodemanager",
    "hadoop-common",
    "hadoop-hdfs-client",
    # the RM's web app binds classes of the timeline service (v2) even when it is off
    "hadoop-yarn-server-timelineservice",
)
#: The NameNode and DataNode (hadoop-hdfs) and hadoop-common, with their runtime dependencies.
_HADOOP_HDFS_ARTIFACTS = ("hadoop-hdfs", "hadoop-common", "hadoop-hdfs-client")


def hadoop_yarn_version() -> str:
    """The Hadoop version of the YARN and HDFS daemons (``$EPOCHAL_HADOOP_YARN_VERSION`` or
    pyspark's).

    Spark's Hadoop client (``hadoop-client-api``/``-runtime`` in pyspark's ``jars/``) talks to
    daemons of the same Hadoop release.
    """
    return os.environ.get("EPOCHAL_HADOOP_YARN_VERSION") or pyspark_hadoop_version()


def hadoop_yarn_jars(version: str | None = None) -> Path:
    """Directory holding the YARN daemons' jars (fetched with Maven on first use)."""
    return _hadoop_daemon_jars("yarn", _HADOOP_YARN_ARTIFACTS, version or hadoop_yarn_version())


def hadoop_hdfs_jars(version: str | None = None) -> Path:
    """Directory holding the NameNode's and DataNode's jars (fetched with Maven on first use)."""
    return _hadoop_daemon_jars("hdfs", _HADOOP_HDFS_ARTIFACTS, version or hadoop_yarn_version())


def _hadoop_daemon_jars(kind: str, artifacts: tuple[str, ...], version: str) -> Path:
    """``<cache>/hadoop-<kind>-<version>/libs``: ``artifacts`` of Hadoop ``version`` and their
    runtime dependencies."""
    entry = cache_dir() / f"hadoop-{kind}-{version}"
    libs = entry / "libs"
    marker = entry / ".complete"

    def complete() -> bool:
        jars = (libs / f"{name}-{version}.jar" for name in artifacts)
        return marker.exists() and all(jar.is_file() for jar in jars)

    if complete():
        return libs
    require_java()
    with _locked(entry):
        if complete():
            return libs
        shutil.rmtree(entry, ignore_errors=True)
        entry.mkdir(parents=True)
        dependencies = "".join(
            "\n    <dependency><groupId>org.apache.hadoop</groupId>"
            f"<artifactId>{name}</artifactId><version>{version}</version></dependency>"
            for name in artifacts
        )
        pom = _HADOOP_DAEMONS_POM.format(kind=kind, dependencies=dependencies)
        (entry / "pom.xml").write_text(pom)
        _mvn(
            [
                f"{DEPENDENCY_PLUGIN}:copy-dependencies",
                f"-DoutputDirectory={libs}",
                "-DincludeScope=runtime",
            ],
            f"fetching Hadoop {kind.upper()} {version} jars",
            entry,
        )
        marker.write_text(version + "\n")
        if not complete():
            marker.unlink()
            raise PrerequisiteError(
                f"Hadoop {kind.upper()} {version}: not every jar was fetched into {libs}"
            )
    return libs
