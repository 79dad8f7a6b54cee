"""Class-data sharing for a job's driver JVM: map the classes an earlier run loaded, instead of
loading them again.

Before its first batch ends, a keyed job's driver JVM (in local mode the whole engine) loads
Spark SQL, the Kafka connector, transformWithState, Arrow and Parquet: tens of thousands of
classes, each read from a jar, parsed, verified and linked, on the same 2 cores that run the
query. JDK's class-data sharing stores such classes, parsed and verified, in an archive file
that later JVMs map at start (dynamic CDS archives, JEP 350, JDK 13+): `-XX:ArchiveClassesAtExit`
writes one when a JVM exits, `-XX:SharedArchiveFile` maps it.

Measured on the 2-core machine, P = 8, all 3,000,000 flights, one run each way alternating:
from "starting Spark" to the query's start 7.3 s with the archive against 13.2 s without it,
batch 0 14.3 and 15.1 s against 18.1 and 20.0 s, the whole process 67.4 and 70.3 s against
81.3 and 90.5 s.

The life of an archive (`driver_archive`):

1. No archive for this Java, this Spark and these jars (`archive_key`) yet: the run's JVM gets
   `-XX:ArchiveClassesAtExit=<archive>.<pid>.partial`, and `finish_partial_archive` runs when the
   driver's Python process exits: it stops the SparkContext, closes the JVM's stdin (pyspark's
   gateway exits on EOF), waits for the JVM to write the archive and exit, and renames the file to
   its final name only when the JVM exited with 0. Writing took about 21 s (203 MB) for a keyed
   job's driver, once per machine.
2. Every later run maps it: `-XX:SharedArchiveFile=<archive>`.

A driver JVM that spark-submit starts (Airflow's `spark_submit` task, `launch_job`'s supervisor)
only maps the archive, when it exists (`spark_submit_java_options`): it starts before keyshift's
code runs, so nothing would be there to rename what it wrote. Checked with `-Xlog:cds`: such a
JVM maps the archive a `keyshift job run` wrote ("Mapped dynamic region").

The rename matters: a JVM that maps a truncated archive crashes (SIGBUS, seen on OpenJDK
17.0.15), while an archive that does not fit (another classpath, another JDK) is only refused
with a warning and the JVM loads its classes as without it. A JVM that does not start its driver
from this process (under spark-submit, or a session that exists already) gets nothing from here.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from keyshift.console import STEP

log = logging.getLogger(__name__)

WRITE_TIMEOUT_S = 180.0
"""How long the driver's exit waits for its JVM to write a new archive and exit (seconds)."""

QUIET_DUMP_LOGGING = "-Xlog:cds=error,cds+dynamic=error"
"""While writing an archive the JVM warns once per class it cannot archive (about 1,400 lines for
a keyed job: classes of signed jars, pre-Java-6 class files, generated classes); errors stay on."""


@dataclass(frozen=True)
class DriverArchive:
    """What a run does with the driver JVM's class archive.

    Attributes:
        path: the archive's final path (`<cache>/jvm/driver-<key>.jsa`).
        mode: `use` (map the archive at `path`) or `write` (this run's JVM writes it at exit).
        java_options: the JVM options that do it, for `spark.driver.extraJavaOptions`.
    """

    path: Path
    mode: str
    java_options: str


def java_executable() -> Path | None:
    """The `java` spark-submit runs: `$JAVA_HOME/bin/java`, else the first on PATH, symlinks
    resolved; None when there is none."""
    home = os.environ.get("JAVA_HOME")
    found = Path(home) / "bin" / "java" if home else None
    if found is None or not found.exists():
        which = shutil.which("java")
        found = Path(which) if which else None
    return found.resolve() if found else None


def archive_key(java: Path, spark_jars_dir: Path, jars: Iterable[Path]) -> str:
    """A hex digest (16 characters) naming what an archive depends on: the `java` launcher and
    the JVM library beside it (`lib/server/libjvm.so`, which a JDK update replaces even when the
    launcher stays the same), Spark's own jars and the extra jars in classpath order, each by
    path, size and modification time. Any change gives a new key, hence a new archive."""

    def stamp(path: Path) -> list:
        stat = path.stat()
        return [str(path), stat.st_size, stat.st_mtime_ns]

    spark_jars = sorted(spark_jars_dir.glob("*.jar")) if spark_jars_dir.is_dir() else []
    libjvm = java.parent.parent / "lib" / "server" / "libjvm.so"
    parts = {"java": stamp(java), "libjvm": stamp(libjvm) if libjvm.exists() else None, "spark_jars": [stamp(jar) for jar in spark_jars], "jars": [stamp(Path(jar)) for jar in jars]}
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def _remove_orphaned_partials(folder: Path) -> None:
    """Delete partial archives whose writer process is gone (a driver killed before it renamed)."""
    for partial in folder.glob("*.partial"):
        pid = partial.suffixes[-2].lstrip(".") if len(partial.suffixes) >= 2 else ""
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            partial.unlink(missing_ok=True)


def archive_path(cache: Path, jars: Iterable[Path]) -> Path | None:
    """Where the driver JVM's archive for these jars, this Spark and this Java is (or will be):
    `cache/jvm/driver-<archive_key>.jsa`; None when no `java` is found. Creates nothing."""
    import pyspark

    java = java_executable()
    if java is None:
        return None
    return cache / "jvm" / f"driver-{archive_key(java, Path(pyspark.__file__).parent / 'jars', list(jars))}.jsa"


def spark_submit_java_options(cache: Path, jars: Iterable[Path]) -> str:
    """`-XX:SharedArchiveFile=<archive>` for a driver JVM that spark-submit starts with `jars`
    (`--driver-java-options`), when the archive exists; "" otherwise (the JVM then loads its
    classes as without one). A JVM given a path whose file is gone later starts without it."""
    path = archive_path(cache, jars)
    return f"-XX:SharedArchiveFile={path}" if path is not None and path.exists() else ""


def driver_archive(cache: Path, jars: Iterable[Path]) -> DriverArchive | None:
    """Decide this run's archive: map the one that exists, or write it at exit.

    Args:
        cache: keyshift's cache directory; archives go to `cache/jvm/`.
        jars: the extra jars of the session (`spark.jars`), in order.

    Returns:
        The decision; in `write` mode `finish_partial_archive` is registered to run at this
        process's exit. None when no `java` is found or the driver JVM runs already (under
        spark-submit, or after an earlier session in this process), since options cannot reach it.
    """
    from pyspark import SparkContext

    if SparkContext._gateway is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
        return None
    path = archive_path(cache, jars)
    if path is None:
        return None
    folder = path.parent
    folder.mkdir(parents=True, exist_ok=True)
    if path.exists():
        return DriverArchive(path, "use", f"-XX:SharedArchiveFile={path}")
    _remove_orphaned_partials(folder)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    atexit.register(finish_partial_archive, partial, path)
    log.info("no class archive for this driver JVM yet: this run writes %s when it exits (once, about 20 s)", path, extra=STEP)
    return DriverArchive(path, "write", f"-XX:ArchiveClassesAtExit={partial} {QUIET_DUMP_LOGGING}")


def finish_partial_archive(partial: Path, final: Path, timeout_s: float = WRITE_TIMEOUT_S) -> bool:
    """At the driver's exit: let the JVM write `partial` and exit, then rename it to `final`.

    Stops the active SparkContext, closes its JVM's stdin and waits up to `timeout_s` seconds.
    Renames only when the JVM exited with 0 and left a non-empty file, then deletes the folder's
    other archives (another JDK's or jar set's, about 200 MB each); otherwise deletes what the
    JVM left. Never raises: a failure is logged, and the next run writes the archive again.

    Returns:
        True when `final` now holds the new archive.
    """
    from pyspark import SparkContext

    context = SparkContext._active_spark_context
    process = getattr(getattr(context, "_gateway", None), "proc", None) if context is not None else None
    if process is None:  # the JVM was not started from here, or was never started
        partial.unlink(missing_ok=True)
        return False
    started = time.monotonic()
    log.info("writing the driver JVM's class archive for later runs to %s (once, about 20 s)", final, extra=STEP)
    try:
        context.stop()
        process.stdin.close()
        code = process.wait(timeout=timeout_s)
    except Exception as exc:  # an exit hook must not fail the run
        log.warning("the class archive was not written (%s: %s); the next run writes it", type(exc).__name__, exc)
        partial.unlink(missing_ok=True)
        return False
    if code != 0 or not partial.exists() or partial.stat().st_size == 0:
        log.warning("the driver JVM exited with %s without a complete class archive; the next run writes it", code)
        partial.unlink(missing_ok=True)
        return False
    os.replace(partial, final)
    for stale in final.parent.glob("driver-*.jsa"):  # another JDK's or jar set's: never mapped again
        if stale != final:
            stale.unlink(missing_ok=True)
    log.info("class archive %s written (%.0f MB) in %.1f s; later runs map it", final, final.stat().st_size / 1e6,
             time.monotonic() - started, extra=STEP)
    return True
