"""The driver JVM's class archive: its key, the cleanup of orphaned partials, and the rename that
only a complete archive gets (`keyshift.runtime.class_archive`).

`finish_partial_archive` is driven here by a stand-in for the driver JVM: a child Python process
that, like pyspark's gateway JVM, runs until its stdin closes, then writes the archive file and
exits with a chosen code. The real JVM writing and mapping an archive is exercised by every
integration test that runs `keyshift job run`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from pyspark import SparkContext

from keyshift.runtime import class_archive
from keyshift.runtime.class_archive import (
    _remove_orphaned_partials,
    archive_key,
    archive_path,
    driver_archive,
    finish_partial_archive,
    spark_submit_java_options,
)


def _jar(folder: Path, name: str, data: bytes) -> Path:
    path = folder / name
    path.write_bytes(data)
    return path


def test_archive_key_changes_with_any_jar_and_with_java(tmp_path):
    java = _jar(tmp_path, "java", b"jvm")
    spark_jars = tmp_path / "spark-jars"
    spark_jars.mkdir()
    _jar(spark_jars, "spark-sql.jar", b"sql")
    kafka = _jar(tmp_path, "kafka.jar", b"kafka")
    key = archive_key(java, spark_jars, [kafka])
    assert len(key) == 16 and key == archive_key(java, spark_jars, [kafka])
    assert archive_key(java, spark_jars, []) != key  # a jar fewer
    stat = kafka.stat()
    kafka.write_bytes(b"kafka-4")  # another size
    assert archive_key(java, spark_jars, [kafka]) != key
    kafka.write_bytes(b"kafka")
    os.utime(kafka, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))  # same size, rewritten later
    assert archive_key(java, spark_jars, [kafka]) != key
    os.utime(kafka, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert archive_key(java, spark_jars, [kafka]) == key
    _jar(spark_jars, "spark-core.jar", b"core")  # Spark's own jars changed
    assert archive_key(java, spark_jars, [kafka]) != key
    other_java = _jar(tmp_path, "java17", b"jvm")
    assert archive_key(other_java, spark_jars, [kafka]) != archive_key(java, spark_jars, [kafka])


def test_archive_key_changes_with_the_jvm_library_beside_the_launcher(tmp_path):
    """A JDK update in place may keep the `java` launcher byte for byte and replace libjvm.so."""
    home = tmp_path / "jdk"
    (home / "bin").mkdir(parents=True)
    (home / "lib" / "server").mkdir(parents=True)
    java = _jar(home / "bin", "java", b"launcher")
    libjvm = _jar(home / "lib" / "server", "libjvm.so", b"jvm 17.0.15")
    key = archive_key(java, tmp_path, [])
    libjvm.write_bytes(b"jvm 17.0.16 build")
    assert archive_key(java, tmp_path, []) != key


def test_orphaned_partials_are_removed_and_live_ones_kept(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    orphan = _jar(tmp_path, f"driver-abc.jsa.{dead.stdout.strip()}.partial", b"x")
    live = _jar(tmp_path, f"driver-abc.jsa.{os.getpid()}.partial", b"x")
    final = _jar(tmp_path, "driver-abc.jsa", b"archive")
    _remove_orphaned_partials(tmp_path)
    assert not orphan.exists()
    assert live.exists() and final.exists()


class _FakeGateway:
    def __init__(self, proc):
        self.proc = proc


class _FakeContext:
    """What `finish_partial_archive` uses of a SparkContext: `stop()` and `_gateway.proc`."""

    def __init__(self, proc):
        self._gateway = _FakeGateway(proc)
        self.stopped = False

    def stop(self):
        self.stopped = True


def _fake_jvm(partial: Path, write: bool, code: int) -> subprocess.Popen:
    """A process that waits for EOF on stdin, then (optionally) writes `partial` and exits `code`."""
    script = (
        "import sys\n"
        "sys.stdin.read()\n"
        f"if {write!r}: open({str(partial)!r}, 'wb').write(b'archive' * 100)\n"
        f"sys.exit({code})\n"
    )
    return subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE)


@pytest.mark.parametrize(
    ("write", "code", "renamed"),
    [(True, 0, True), (True, 1, False), (False, 0, False)],
    ids=["complete", "jvm-failed", "nothing-written"],
)
def test_only_a_complete_archive_is_renamed(tmp_path, monkeypatch, write, code, renamed):
    partial = tmp_path / "driver-abc.jsa.123.partial"
    final = tmp_path / "driver-abc.jsa"
    older = _jar(tmp_path, "driver-old.jsa", b"another JDK's archive")
    context = _FakeContext(_fake_jvm(partial, write, code))
    monkeypatch.setattr(SparkContext, "_active_spark_context", context)
    assert finish_partial_archive(partial, final, timeout_s=30) is renamed
    assert context.stopped
    assert final.exists() is renamed
    assert not partial.exists()  # renamed, or deleted so that a later run never maps half an archive
    assert older.exists() is not renamed  # replaced by the new one, or kept while there is none
    if renamed:
        assert final.read_bytes() == b"archive" * 100


def test_no_context_deletes_the_partial(tmp_path, monkeypatch):
    partial = _jar(tmp_path, "driver-abc.jsa.123.partial", b"half")
    monkeypatch.setattr(SparkContext, "_active_spark_context", None)
    assert finish_partial_archive(partial, tmp_path / "driver-abc.jsa") is False
    assert not partial.exists()


def test_driver_archive_uses_an_existing_archive_and_otherwise_writes_one(tmp_path, monkeypatch):
    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    monkeypatch.setattr(SparkContext, "_gateway", None)
    registered = []
    monkeypatch.setattr(class_archive.atexit, "register", lambda *args: registered.append(args))
    jar = _jar(tmp_path, "kafka.jar", b"kafka")
    first = driver_archive(tmp_path / "cache", [jar])
    assert first.mode == "write"
    assert first.java_options.startswith(f"-XX:ArchiveClassesAtExit={first.path}.{os.getpid()}.partial ")
    assert registered == [(finish_partial_archive, Path(f"{first.path}.{os.getpid()}.partial"), first.path)]
    first.path.write_bytes(b"archive")
    second = driver_archive(tmp_path / "cache", [jar])
    assert (second.mode, second.path, second.java_options) == ("use", first.path, f"-XX:SharedArchiveFile={first.path}")
    assert len(registered) == 1


def test_driver_archive_stays_out_of_a_running_jvm(tmp_path, monkeypatch):
    monkeypatch.setenv("PYSPARK_GATEWAY_PORT", "12345")  # under spark-submit: the JVM started before us
    assert driver_archive(tmp_path / "cache", []) is None


def test_spark_submit_launches_map_an_archive_only_when_it_exists(tmp_path):
    jar = _jar(tmp_path, "kafka.jar", b"kafka")
    cache = tmp_path / "cache"
    assert spark_submit_java_options(cache, [jar]) == ""  # none yet: such a JVM never writes one
    path = archive_path(cache, [jar])
    path.parent.mkdir(parents=True)
    path.write_bytes(b"archive")
    assert spark_submit_java_options(cache, [jar]) == f"-XX:SharedArchiveFile={path}"
    assert not list(path.parent.glob("*.partial"))
