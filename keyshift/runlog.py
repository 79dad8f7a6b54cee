"""A run's log file, `runs/<run_id>/driver.log`: where the log lines of a CLI run go.

`keyshift job run` and `keyshift run demo` keep the terminal for progress, warnings and the
summary; everything else goes to the run's driver log:

- this process's Python logging (keyshift's INFO lines, py4j, kafka-python), through a
  `logging.FileHandler` on the root logger (`attach`);
- the driver JVM's output: Spark's log4j lines (configured by `LOG4J2_CONFIG`: WARN and above,
  Spark's level for pyspark), the JVM's own warnings, and what the Python workers print (Spark
  copies their stdout and stderr to the JVM's stderr, not to log4j). The JVM is started with its
  stderr appended to the file (`keyshift.runtime.session.build_spark_session` with `output=`),
  and its stdout on this process's stderr, where log4j also writes each Spark ERROR as one line.

Airflow's runs do not come through here: under spark-submit the JVM exists before Python starts,
and the task log keeps Spark's and Python's defaults.
"""

from __future__ import annotations

import logging
import traceback
from pathlib import Path

from keyshift.names import RunDir
from keyshift.settings import PROJECT_ROOT


LOG4J2_CONFIG = PROJECT_ROOT / "infra" / "spark" / "log4j2-driver.properties"
"""log4j2 configuration of a driver JVM whose stderr is a driver log (see the file's comments)."""

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
"""Format of this process's lines in the driver log (the CLI's `logging.basicConfig` format)."""

_handler: logging.FileHandler | None = None


def driver_log_path(run_dir: Path) -> Path:
    """`<run_dir>/driver.log`, the log file of the run whose folder is `run_dir`."""
    return RunDir(Path(run_dir)).driver_log


def attach(path: Path) -> Path:
    """Append this process's log records to `path` from now on, at the root logger's level.

    The root logger keeps its other handlers (the terminal's). Attaching the file that is
    attached already does nothing; attaching another one replaces it (one driver log per process).

    Args:
        path: the log file; its folder is created if missing.

    Returns:
        `path`.
    """
    global _handler
    if _handler is not None and Path(_handler.baseFilename) == path.resolve():
        return path
    detach()
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, mode="a", encoding="utf-8")
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    logging.getLogger().addHandler(handler)
    _handler = handler
    return path


def detach() -> None:
    """Stop writing log records to the driver log (if one is attached) and close it."""
    global _handler
    if _handler is not None:
        logging.getLogger().removeHandler(_handler)
        _handler.close()
        _handler = None


def active() -> Path | None:
    """The driver log this process writes to, or None when none is attached."""
    return Path(_handler.baseFilename) if _handler is not None else None


def record_failure(exc: BaseException) -> Path | None:
    """Write `exc` with its traceback to the attached driver log only (never to the terminal).

    Returns:
        The driver log's path, or None (and nothing written) when none is attached.
    """
    if _handler is None:
        return None
    record = logging.LogRecord("keyshift", logging.ERROR, __file__, 0, "the run failed: %s: %s",
                               (type(exc).__name__, exc), None)
    record.exc_text = "".join(traceback.format_exception(exc)).rstrip()
    _handler.handle(record)
    return active()


def jvm_options() -> str:
    """The driver JVM options that make log4j read `LOG4J2_CONFIG` (`spark.driver.extraJavaOptions`)."""
    return f"-Dlog4j2.configurationFile={LOG4J2_CONFIG.as_uri()}"
