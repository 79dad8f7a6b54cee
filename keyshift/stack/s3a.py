"""Hadoop's S3A connector, for checkpoint locations on an object store (`s3a://bucket/path`).

pyspark bundles Hadoop's client (3.5.0) but not its S3A filesystem. `infra/s3/pom.xml` fetches
`hadoop-aws` at that version with the few AWS SDK modules S3A uses (13 MB, once, into the cache),
not the SDK's 686 MB bundle. A job whose `settings.checkpoint_location` is an `s3a://` URI gets
these jars on `spark.jars` (`job_jars`) and S3A's settings as `spark.hadoop.fs.s3a.*`
(`spark_conf`), which reach the driver's and the executors' Hadoop configuration alike.

The settings follow Hadoop's S3A documentation ("Connecting to an S3-compatible store"): an
endpoint of one's own (`settings.s3_endpoint`) gets path-style access and, for `http://`, no TLS;
credentials come from `settings.s3_access_key`/`s3_secret_key` when set, else from S3A's default
provider chain (environment, profile, instance or pod role).
"""

from __future__ import annotations

from pathlib import Path

from keyshift.errors import StackError
from keyshift.settings import PROJECT_ROOT, Settings
from keyshift.stack import maven

POM = PROJECT_ROOT / "infra" / "s3" / "pom.xml"
SCHEME = "s3a://"


def needed(settings: Settings) -> bool:
    """True when the settings' checkpoint location is on S3A (`s3a://...`)."""
    return (settings.checkpoint_location or "").startswith(SCHEME)


def connector_jars(settings: Settings) -> list[Path]:
    """`hadoop-aws` and the AWS SDK modules it uses, fetched into `<cache>/s3a-jars` on first use.

    Returns:
        Absolute paths of the jars, sorted by file name.

    Raises:
        StackError: when Maven is missing or fails, or the fetch holds no `hadoop-aws` jar.
    """
    jars = maven.copy_dependencies(POM, settings.cache / "s3a-jars")
    if not any(jar.name.startswith("hadoop-aws-") for jar in jars):
        raise StackError(f"{POM} fetched no hadoop-aws jar into {settings.cache / 's3a-jars'}")
    return jars


def spark_conf(settings: Settings) -> dict[str, str]:
    """S3A's settings as Spark configuration (`spark.hadoop.fs.s3a.*`); {} unless `needed`.

    With `settings.s3_endpoint`: `fs.s3a.endpoint`, path-style access, the region `us-east-1`
    (S3A needs one to sign; an S3-compatible store ignores it), no `Expect: 100-continue` (uploads
    through the sync client) and,
    for an `http://` endpoint, TLS off. With both credentials set: `fs.s3a.access.key`/`fs.s3a.secret.key` (the secret is then in
    the Spark configuration, visible in the Spark UI's environment page: use the provider chain in
    production).
    """
    if not needed(settings):
        return {}
    conf: dict[str, str] = {}
    if settings.s3_endpoint:
        conf.update({
            "spark.hadoop.fs.s3a.endpoint": settings.s3_endpoint,
            "spark.hadoop.fs.s3a.path.style.access": "true",
            "spark.hadoop.fs.s3a.endpoint.region": "us-east-1",
            "spark.hadoop.fs.s3a.connection.ssl.enabled": str(settings.s3_endpoint.startswith("https://")).lower(),
            # No `Expect: 100-continue` handshake: moto's server, like some other S3-compatible
            # stores, answers it with a bare 100 that the AWS SDK fails on ("S3Exception: Status
            # Code: 100"). The sync client's PUTs drop it with `expect.continue` (HADOOP-18915);
            # `copyFromLocalFile`, which RocksDB's state store uploads its files with, otherwise
            # goes through the transfer manager's async client, which keeps it.
            "spark.hadoop.fs.s3a.connection.expect.continue": "false",
            "spark.hadoop.fs.s3a.optimized.copy.from.local.enabled": "false",
        })
    if settings.s3_access_key and settings.s3_secret_key is not None:
        conf["spark.hadoop.fs.s3a.access.key"] = settings.s3_access_key
        conf["spark.hadoop.fs.s3a.secret.key"] = settings.s3_secret_key.get_secret_value()
    return conf
