"""The files of a Spark checkpoint location, on the driver's disk or on any Hadoop FileSystem.

A streaming query's `checkpointLocation` is a Hadoop path: a local folder on one machine, or a URI
such as `hdfs://namenode:8020/keyshift/checkpoints/<run_id>/checkpoint` or `s3a://bucket/...` on a
cluster, where every executor and a restarted driver must find it. Spark reads and writes it
through Hadoop's `FileSystem`; keyshift's driver reads a few of its files itself (the offset
and commit logs `offsets/<b>` and `commits/<b>`, Spark's own format) and so must go through the
same `FileSystem`, with the Hadoop configuration of the driver's SparkSession (the same
credentials and endpoints as Spark's). Executors never read a checkpoint's files: what a task
needs of them, the driver publishes (`keyshift.eventtime.batch_channel`).

`CheckpointFiles` is that access: a local path (no scheme, or `file:`) uses Python's file API; any
other scheme uses `org.apache.hadoop.fs.FileSystem` of the active SparkSession's JVM through
Py4J (Spark's own route for Python: `SparkContext._jvm`).
"""

from __future__ import annotations

import re
from pathlib import Path

from keyshift.errors import ConfigurationError

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def is_uri(location: str | Path) -> bool:
    """Whether `location` is a URI with a scheme other than `file` (a Hadoop FileSystem's)."""
    text = str(location)
    return bool(_SCHEME.match(text)) and not text.startswith("file:")


def join(location: str | Path, *names: str) -> str | Path:
    """`location` / names: a Path for a local location, a URI string (joined with `/`) otherwise."""
    if is_uri(location):
        return "/".join([str(location).rstrip("/"), *names])
    return Path(str(location).removeprefix("file://")).joinpath(*names)


def checkpoint_name(location: str | Path) -> str:
    """The last name of a checkpoint location, a path or a Hadoop URI
    (`hdfs://nn:8020/keyshift/r/checkpoint-1` and `runs/r/checkpoint-1` -> `checkpoint-1`)."""
    return str(location).rstrip("/").rsplit("/", 1)[-1]


def sibling(location: str, name: str) -> str:
    """The location named `name` beside `location` (a segment's `checkpoint` field): for a URI or
    a path, its last name replaced; for a bare name (a folder of the run folder), `name` itself."""
    text = str(location).rstrip("/")
    return f"{text.rsplit('/', 1)[0]}/{name}" if "/" in text else name


class CheckpointFiles:
    """Read a checkpoint location's files, locally or through Hadoop's FileSystem (module docstring).

    Args:
        location: a local path, a `file://` URI, or a Hadoop URI (`hdfs://`, `s3a://`, ...).
        spark: the SparkSession whose Hadoop configuration reaches the location; None: the
            active session (needed only for a Hadoop URI).

    Raises:
        ConfigurationError: a Hadoop URI without an active SparkSession (only the driver of a
            run, which has one, reads a remote checkpoint).
    """

    def __init__(self, location: str | Path, spark=None) -> None:
        self.location = location
        self._fs = None
        if is_uri(location):
            from pyspark.sql import SparkSession

            session = spark or SparkSession.getActiveSession()
            if session is None:
                raise ConfigurationError(f"reading the checkpoint {location} needs a SparkSession (its Hadoop FileSystem); "
                                         "read it from the run's driver")
            jvm = session.sparkContext._jvm
            self._jvm = jvm
            self._fs = jvm.org.apache.hadoop.fs.Path(str(location)).getFileSystem(session.sparkContext._jsc.hadoopConfiguration())

    def _local(self, relative: str) -> Path:
        return Path(join(self.location, *[p for p in relative.split("/") if p]))

    def _path(self, relative: str):
        return self._jvm.org.apache.hadoop.fs.Path(str(join(self.location, *[p for p in relative.split("/") if p])))

    def exists(self, relative: str = "") -> bool:
        """Whether `relative` (a `/`-separated path below the location; "" = the location) exists."""
        if self._fs is None:
            return self._local(relative).exists()
        return bool(self._fs.exists(self._path(relative)))

    def names(self, relative: str) -> list[str]:
        """The names in folder `relative` (files and folders, unsorted); [] when it does not exist."""
        if self._fs is None:
            folder = self._local(relative)
            return [p.name for p in folder.iterdir()] if folder.is_dir() else []
        path = self._path(relative)
        if not self._fs.exists(path):
            return []
        return [status.getPath().getName() for status in self._fs.listStatus(path)]

    def read_text(self, relative: str) -> str:
        """The UTF-8 text of file `relative`.

        Raises:
            FileNotFoundError: it does not exist. OSError: it cannot be read.
        """
        if self._fs is None:
            return self._local(relative).read_text()
        path = self._path(relative)
        if not self._fs.exists(path):
            raise FileNotFoundError(f"{join(self.location, relative)} does not exist")
        stream = self._fs.open(path)
        try:
            return self._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8")
        except Exception as exc:  # Py4JJavaError: the Hadoop client's IOException
            raise OSError(f"cannot read {join(self.location, relative)}: {exc}") from exc
        finally:
            stream.close()

    def modified_s(self, relative: str) -> float:
        """File `relative`'s modification time, seconds since the epoch.

        Raises:
            FileNotFoundError: it does not exist.
        """
        if self._fs is None:
            return self._local(relative).stat().st_mtime
        path = self._path(relative)
        if not self._fs.exists(path):
            raise FileNotFoundError(f"{join(self.location, relative)} does not exist")
        return self._fs.getFileStatus(path).getModificationTime() / 1000.0
