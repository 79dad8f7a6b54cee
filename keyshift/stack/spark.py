"""Spark's Kafka connector jars, fetched once from Maven Central into the cache.

pyspark's own `jars/` lacks the Kafka source and sink. `infra/spark/pom.xml` names the four jars
they need at pyspark's version: `spark-sql-kafka-0-10_2.13`, `spark-token-provider-kafka-0-10_2.13`,
`kafka-clients` and `commons-pool2` (and nothing pyspark ships already, lz4-java above all). Give
the paths to `spark.jars` (comma-joined) before the first `getOrCreate()`, or to `spark-submit --jars`.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping, MutableMapping
from pathlib import Path

from keyshift.errors import StackError
from keyshift.settings import PROJECT_ROOT, Settings
from keyshift.stack import maven

log = logging.getLogger("keyshift.stack.spark")

SPARK_VERSION = "4.2.0"
"""pyspark's version; the connector must match it exactly."""
POM = PROJECT_ROOT / "infra" / "spark" / "pom.xml"
CONNECTOR_ARTIFACTS = (
    "spark-sql-kafka-0-10_2.13",
    "spark-token-provider-kafka-0-10_2.13",
    "kafka-clients",
    "commons-pool2",
)
"""Artifact ids of the jars the connector needs beside pyspark's own."""


def jars_dir(settings: Settings) -> Path:
    """Folder of the connector jars in the cache: `<cache>/spark-kafka-connector-<version>`."""
    return settings.cache / f"spark-kafka-connector-{SPARK_VERSION}"


def connector_jars(settings: Settings) -> list[Path]:
    """The four Kafka connector jars for pyspark, fetched into the cache on first use.

    Returns:
        Absolute paths of the jars, sorted by file name.

    Raises:
        StackError: when Maven is missing or fails, or a needed artifact is not among the jars.
    """
    jars = maven.copy_dependencies(POM, jars_dir(settings))
    for artifact in CONNECTOR_ARTIFACTS:
        if not any(jar.name.startswith(f"{artifact}-") for jar in jars):
            raise StackError(f"{POM} fetched no {artifact} jar into {jars_dir(settings)}")
    return jars


def job_jars(settings: Settings) -> list[Path]:
    """The jars a keyshift job needs beside pyspark's: the Kafka connector's and, when the
    checkpoint location is on S3A (`s3a://`), Hadoop's S3A connector (`keyshift.stack.s3a`).

    Raises:
        StackError: when Maven is missing or fails.
    """
    from keyshift.stack import s3a

    return connector_jars(settings) + (s3a.connector_jars(settings) if s3a.needed(settings) else [])


def jars_option(settings: Settings) -> str:
    """A job's jars (`job_jars`) comma-joined, the value for `spark.jars` or `spark-submit --jars`."""
    return ",".join(str(jar) for jar in job_jars(settings))


LOCAL_IP_VARIABLE = "SPARK_LOCAL_IP"
"""The environment variable that sets the address a Spark driver binds to, its web UI included.

Spark's web UI (port 4040) listens on `SPARK_LOCAL_IP`, else on 0.0.0.0: no configuration key
moves it (`spark.driver.bindAddress` and `spark.driver.host` cover only the RPC and block manager
ports). It must be in the environment before the driver's JVM starts."""
LOOPBACK = "127.0.0.1"


def is_local_master(master: str) -> bool:
    """True for `local`, `local[N]`, `local[*]`, `local[N,F]`: driver and executors in one JVM."""
    return master == "local" or master.startswith("local[")


def local_master_cores(master: str) -> int | None:
    """The task slots of a local Spark master: `local` 1, `local[N]` (or `local[N,F]`) N,
    `local[*]` the machine's cores (`os.cpu_count()`); None for any other master (a cluster's
    cores are known once its session runs: `SparkContext.defaultParallelism`)."""
    match = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\s*\d+)?\])?", master.strip())
    if match is None:
        return None
    if match.group(1) in (None, ""):
        return 1
    return os.cpu_count() or 1 if match.group(1) == "*" else int(match.group(1))


def loopback_env(settings: Settings) -> dict[str, str]:
    """`{"SPARK_LOCAL_IP": "127.0.0.1"}` for a local master, `{}` for a cluster one.

    With a local master nothing outside this host needs the driver, so its ports and its UI
    bind to loopback; a cluster's executors must reach the driver, so there the choice stays
    with whoever runs it (the compose file, spark-submit's environment).
    """
    return {LOCAL_IP_VARIABLE: LOOPBACK} if is_local_master(settings.spark_master) else {}


def bind_loopback(settings: Settings, environ: MutableMapping[str, str] | None = None) -> None:
    """Put `loopback_env(settings)` into `environ` (default `os.environ`), unless already set there.

    Call it before the first SparkSession of the process (the `keyshift` command does); a
    `SPARK_LOCAL_IP` the user set is kept.
    """
    target = os.environ if environ is None else environ
    for key, value in loopback_env(settings).items():
        target.setdefault(key, value)


SPARK_HOME_MARKER = ".keyshift-spark-home"
"""The file in `worker_spark_home`'s folder naming the pyspark installation its links point to."""


def worker_spark_home(cache: Path) -> Path:
    """A `SPARK_HOME` for a driver JVM started from this environment whose Python workers import
    pyspark from the environment (compiled once, bytecode cached) instead of from
    `$SPARK_HOME/python/lib/pyspark.zip`.

    Spark puts `$SPARK_HOME/python/lib/pyspark.zip` first on every Python worker's `PYTHONPATH`
    (`PythonUtils.sparkPythonPath`), and pip's pyspark ships that zip without bytecode, so a
    fresh interpreter compiles every pyspark module it imports from source: 0.8 to 0.9 s for
    `import pyspark.sql` on this project's 2-core machines against 0.2 s from the environment.
    Daemon-forked executor workers pay it once per JVM; transformWithState's driver-side
    pre-init process (`StreamingPythonRunner`, a new interpreter at the first batch of every
    query, so at every switch) pays it each time. This folder is pyspark's own home with every
    entry linked except `python/`: `bin/`, `jars/` and the rest are the same files, and the
    workers find pyspark where the driver found it (the same installation).

    Args:
        cache: keyshift's cache folder (`Settings.cache`); the folder is
            `<cache>/spark-home-<pyspark version>/`, made once (and again when pyspark moved).

    Returns:
        The folder, for the driver JVM's `SPARK_HOME`.

    Raises:
        OSError: the folder cannot be made (the caller keeps pyspark's own home).
    """
    import shutil

    import pyspark

    real = Path(pyspark.__file__).resolve().parent
    home = cache / f"spark-home-{pyspark.__version__}"
    marker = home / SPARK_HOME_MARKER

    def ready() -> bool:
        return marker.is_file() and marker.read_text() == str(real)

    if ready():
        return home
    staging = home.with_name(f"{home.name}.{os.getpid()}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for entry in sorted(real.iterdir()):
        if entry.name not in ("python", "__pycache__"):
            (staging / entry.name).symlink_to(entry)
    (staging / SPARK_HOME_MARKER).write_text(str(real))
    if not ready():  # another process may have made it meanwhile, and a driver may use it: keep it
        shutil.rmtree(home, ignore_errors=True)  # one of another pyspark installation
        try:
            staging.rename(home)
        except OSError:  # another process made it in between
            if not ready():
                raise
    shutil.rmtree(staging, ignore_errors=True)
    log.info("SPARK_HOME for the driver JVM: %s (pyspark's %s without python/lib/pyspark.zip)", home, real)
    return home


def worker_spark_home_env(cache: Path, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """`{"SPARK_HOME": worker_spark_home(cache)}` for a driver JVM started from this environment
    (by pyspark's gateway, `spark-submit` or the supervisor), or `{}` when `environ` (default
    `os.environ`) names a Spark home other than pyspark's own (a distribution of the user's, kept)
    or when the folder cannot be made (logged: the workers then compile pyspark at each start)."""
    import pyspark

    environ = os.environ if environ is None else environ
    own = environ.get("SPARK_HOME")
    if own and Path(own).resolve() != Path(pyspark.__file__).resolve().parent:
        return {}
    try:
        return {"SPARK_HOME": str(worker_spark_home(cache))}
    except OSError as exc:
        log.warning("keeping pyspark's SPARK_HOME (its Python workers compile pyspark at each start): %s", exc)
        return {}
