"""The fast SPARK_HOME: PySpark's Python processes import PySpark from its bytecode."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from epochal.startup import home


def test_the_fast_home_has_everything_but_the_source_zips(tmp_path: Path) -> None:
    package = home.package_home()
    assert package is not None, "pip's pyspark is Spark's home"
    fast = Path(home.fast_spark_home(package, root=str(tmp_path)))
    assert (fast / "bin" / "spark-submit").resolve() == Path(package, "bin", "spark-submit")
    assert (fast / "jars").is_dir()
    assert sorted(os.listdir(fast / "python" / "lib")) == []
    assert set(os.listdir(Path(package) / "python" / "lib")) >= {"pyspark.zip"}
    again = home.fast_spark_home(package, root=str(tmp_path))  # made once, then found
    assert Path(again) == fast
    assert [p.name for p in tmp_path.iterdir()] == [fast.name]  # no building leftovers


def test_it_is_used_only_where_it_is_safe(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("SPARK_HOME", "/opt/spark")
    assert home.use_fast_spark_home("local[2]") is None  # the user's own Spark
    monkeypatch.delenv("SPARK_HOME")
    assert home.use_fast_spark_home("yarn") is None  # YARN ships pyspark.zip to executors
    monkeypatch.setenv(home.SWITCH_ENV, "asis")
    assert home.use_fast_spark_home("local[2]") is None
    monkeypatch.delenv(home.SWITCH_ENV)
    chosen = home.use_fast_spark_home("local[2]")
    assert chosen is not None and chosen.startswith(str(tmp_path))
    assert os.environ["SPARK_HOME"] == chosen


@pytest.mark.spark
def test_python_workers_import_pyspark_compiled(tmp_path: Path) -> None:
    """A Python worker of a session epochal builds imports PySpark from the installed
    package, not from Spark's source zip (fails if the fast home is not used)."""
    code = (
        "import pyspark\n"
        "from epochal.startup.session import SessionProfile, spark_session\n"
        "spark = spark_session(SessionProfile('local[1]'))\n"
        "where = spark.sparkContext.parallelize([0], 1).map(\n"
        "    lambda _: __import__('pyspark').__file__).collect()[0]\n"
        "print('WORKER', where)\n"
        "spark.stop()\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_HOME", home.SWITCH_ENV)}
    env["XDG_CACHE_HOME"] = str(tmp_path)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("WORKER ")]
    assert lines, result.stdout + result.stderr[-3000:]
    where = lines[0].split(" ", 1)[1]
    assert ".zip" not in where and where.endswith("__init__.py"), where


def test_driver_options_name_the_class_data_archive_when_there_is_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from epochal.startup import classdata

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(classdata.SWITCH_ENV, raising=False)
    assert classdata.driver_java_options("-Xss4m") == "-Xss4m"  # none made yet
    spark_home = home.package_home()
    assert spark_home is not None
    monkeypatch.setenv("SPARK_HOME", spark_home)
    archive = classdata.archive_path(spark_home)
    assert archive is not None and archive.startswith(str(tmp_path))
    os.makedirs(os.path.dirname(archive))
    Path(archive).write_bytes(b"")
    options = classdata.driver_java_options("-Xss4m")
    assert options.startswith(f"-XX:SharedArchiveFile={archive} -Xshare:auto")
    assert options.endswith("-Xss4m")
    dumping = "-XX:ArchiveClassesAtExit=/tmp/x.jsa"
    assert classdata.driver_java_options(dumping) == dumping  # never both
    monkeypatch.setenv(classdata.SWITCH_ENV, "off")
    assert classdata.driver_java_options("-Xss4m") == "-Xss4m"


def test_a_killed_dump_leaves_no_partial_archive_behind(tmp_path: Path) -> None:
    """A dump killed half-way leaves ``<archive>.<pid>.partial`` (about 130 MB); the next
    prepare deletes those of dead processes and keeps one a live process is writing."""
    from epochal.startup import classdata

    dead = tmp_path / "spark-driver-ab.jsa.999999999.partial"  # above any Linux pid
    live = tmp_path / f"spark-driver-ab.jsa.{os.getpid()}.partial"
    archive = tmp_path / "spark-driver-ab.jsa"
    for path in (dead, live, archive):
        path.write_bytes(b"x")
    classdata._remove_dead_partials(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, archive.name])


def test_a_new_archive_removes_all_but_the_ones_used_last(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Each Spark home (a new checkout, a new venv) makes its own archive of about 170 MB: a
    new one removes all but the :data:`ARCHIVES_KEPT` most recently used; a driver marks
    its archive used (at most once an hour), so an old archive still in use is kept."""
    from epochal.startup import classdata

    now = time.time()
    ages = {"a": 10, "b": 20, "c": 30, "d": 40, "e": 50}  # hours since last used
    for name, hours in ages.items():
        path = tmp_path / f"spark-driver-{name}.jsa"
        path.write_bytes(b"x")
        os.utime(path, (now - hours * 3600, now - hours * 3600))
    (tmp_path / "spark-driver-z.jsa.lock").write_bytes(b"")
    monkeypatch.setattr(
        classdata, "archive_path", lambda home: str(tmp_path / "spark-driver-e.jsa")
    )
    monkeypatch.setattr(classdata, "_spark_home", lambda: "/a/spark/home")
    monkeypatch.delenv(classdata.SWITCH_ENV, raising=False)
    assert classdata.driver_java_options().startswith("-XX:SharedArchiveFile=")  # e, in use
    removed = classdata._remove_unused_archives(str(tmp_path), keep=3)
    assert sorted(removed) == ["spark-driver-c.jsa", "spark-driver-d.jsa"]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == [f"spark-driver-{n}.jsa" for n in "abe"] + ["spark-driver-z.jsa.lock"]


@pytest.mark.spark
def test_a_driver_jvm_maps_the_class_data_archive() -> None:
    """After ``epochal prepare``, a driver's JVM starts from the archive (it is mapped into
    its memory); without the mechanism it is not."""
    from epochal.startup import classdata

    archive = classdata.prepare(report=lambda line: None)
    assert archive is not None, "no class-data archive could be made"
    code = (
        "from epochal.startup.session import SessionProfile, spark_session\n"
        "spark = spark_session(SessionProfile('local[1]'))\n"
        "pid = spark.sparkContext._gateway.proc.pid\n"
        "maps = open(f'/proc/{pid}/maps').read()\n"
        f"print('MAPPED', {archive!r} in maps)\n"
        "spark.stop()\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_HOME", classdata.SWITCH_ENV)}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert "MAPPED True" in result.stdout, result.stdout + result.stderr[-3000:]


def test_the_fast_home_has_every_pyspark_jar_and_the_state_file_system(tmp_path: Path) -> None:
    """Its jars/ links each of PySpark's jars and adds the linking file system (built with
    javac, which this project's machines have: a missing JDK would fail this test)."""
    from epochal.startup import statefiles

    package = home.package_home()
    assert package is not None
    fast = Path(home.fast_spark_home(package, root=str(tmp_path)))
    ours = fast / "jars" / statefiles.JAR_NAME
    assert ours.is_file(), "the state file system's jar was not built (is javac there?)"
    assert set(os.listdir(fast / "jars")) == {*os.listdir(Path(package) / "jars"), ours.name}
    assert statefiles.source_digest() in fast.name  # a changed source gets a new home


def test_the_local_file_system_is_used_only_where_every_jvm_has_the_jar(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from epochal.startup import statefiles

    with_jar, without = tmp_path / "with", tmp_path / "without"
    (with_jar / "jars").mkdir(parents=True)
    (with_jar / "jars" / statefiles.JAR_NAME).write_bytes(b"")
    (without / "jars").mkdir(parents=True)
    linking = {
        "spark.hadoop.fs.file.impl": statefiles.FILE_SYSTEM_CLASS,
        "spark.hadoop.fs.AbstractFileSystem.file.impl": statefiles.FILE_CONTEXT_CLASS,
    }
    monkeypatch.delenv(statefiles.SWITCH_ENV, raising=False)
    monkeypatch.setenv("SPARK_HOME", str(with_jar))
    assert statefiles.session_conf("local[2]") == linking
    assert statefiles.session_conf("local-cluster[2,1,1024]") == linking
    assert statefiles.session_conf("spark://host:7077") == {}  # executors elsewhere
    assert statefiles.session_conf("yarn") == {}
    monkeypatch.setenv(statefiles.SWITCH_ENV, "off")  # links off, no processes still
    assert statefiles.session_conf("local[2]") == {
        **linking,
        "spark.hadoop.fs.file.impl": statefiles.COPYING_FILE_SYSTEM_CLASS,
    }
    monkeypatch.delenv(statefiles.SWITCH_ENV)
    monkeypatch.setenv("SPARK_HOME", str(without))  # a Spark home of the user's, or no JDK
    assert statefiles.session_conf("local[2]") == {}


def test_a_jar_rebuilt_under_its_name_gets_a_new_archive(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A JVM refuses an archive whose class path jars changed size or time (the fast home's
    own jar is rebuilt when the home is made again): the archive's name must change too, or
    ``prepare`` would keep an archive no driver can map."""
    from epochal.startup import classdata

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    spark_home = tmp_path / "home"
    (spark_home / "jars").mkdir(parents=True)
    jar = spark_home / "jars" / "a.jar"
    jar.write_bytes(b"x")
    first = classdata.archive_path(str(spark_home))
    assert first is not None
    assert classdata.archive_path(str(spark_home)) == first
    os.utime(jar, ns=(1, 1))
    assert classdata.archive_path(str(spark_home)) != first
