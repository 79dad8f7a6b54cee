"""Spark's Kafka connector jars: the four artifacts, found in the cache without Maven once fetched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from keyshift.errors import StackError
from keyshift.settings import Settings
from keyshift.stack import maven, spark

JARS = [
    "commons-pool2-2.13.1.jar",
    "kafka-clients-3.9.2.jar",
    "spark-sql-kafka-0-10_2.13-4.2.0.jar",
    "spark-token-provider-kafka-0-10_2.13-4.0.0.jar",
]


def _fake_fetch(settings: Settings, jars: list[str]) -> None:
    dest = spark.jars_dir(settings)
    dest.mkdir(parents=True)
    for name in jars:
        (dest / name).write_bytes(b"jar")
    (dest / maven.MANIFEST).write_text(
        json.dumps({"pom_sha256": maven._pom_digest(spark.POM), "jars": jars})
    )


def test_connector_jars_come_from_the_cache_once_fetched(tmp_path, monkeypatch):
    settings = Settings(home=tmp_path)
    _fake_fetch(settings, JARS)
    monkeypatch.setattr(maven.shutil, "which", lambda name: pytest.fail("maven called again"))

    jars = spark.connector_jars(settings)

    assert [jar.name for jar in jars] == JARS
    assert all(jar.is_absolute() and jar.parent == spark.jars_dir(settings) for jar in jars)
    assert spark.jars_option(settings) == ",".join(str(jar) for jar in jars)


def test_a_fetch_missing_an_artifact_is_an_error(tmp_path):
    settings = Settings(home=tmp_path)
    _fake_fetch(settings, JARS[:3])
    with pytest.raises(StackError, match="spark-token-provider"):
        spark.connector_jars(settings)


def test_jars_go_to_the_cache(tmp_path):
    settings = Settings(home=tmp_path / "state", cache_dir=tmp_path / "cache")
    assert spark.jars_dir(settings) == tmp_path / "cache" / "spark-kafka-connector-4.2.0"


def test_pom_pins_pysparks_version():
    import pyspark

    assert pyspark.__version__ == spark.SPARK_VERSION
    assert f"<spark.version>{spark.SPARK_VERSION}</spark.version>" in spark.POM.read_text()


def test_worker_spark_home_links_pyspark_without_its_python_zips(tmp_path):
    import pyspark

    from keyshift.stack.spark import SPARK_HOME_MARKER, worker_spark_home

    real = Path(pyspark.__file__).resolve().parent
    home = worker_spark_home(tmp_path)
    assert home == tmp_path / f"spark-home-{pyspark.__version__}"
    assert (home / "bin").resolve() == real / "bin" and (home / "jars").resolve() == real / "jars"
    assert (home / "bin" / "spark-submit").is_file()
    assert not (home / "python").exists()  # so no python/lib/pyspark.zip on the workers' PYTHONPATH
    assert (real / "python" / "lib" / "pyspark.zip").is_file()  # what it leaves out exists in pyspark's own home
    assert worker_spark_home(tmp_path) == home  # made once
    (home / SPARK_HOME_MARKER).write_text("/elsewhere/pyspark")  # pyspark moved: made again
    assert worker_spark_home(tmp_path) == home and (home / SPARK_HOME_MARKER).read_text() == str(real)
    assert [p.name for p in tmp_path.iterdir()] == [home.name]  # no staging folder left


def test_worker_spark_home_env_keeps_a_spark_distribution_of_the_users(tmp_path):
    import pyspark

    from keyshift.stack.spark import worker_spark_home_env

    own = Path(pyspark.__file__).resolve().parent
    assert worker_spark_home_env(tmp_path, {})["SPARK_HOME"].startswith(str(tmp_path))
    assert worker_spark_home_env(tmp_path, {"SPARK_HOME": str(own)})["SPARK_HOME"].startswith(str(tmp_path))  # pyspark's: replaced
    assert worker_spark_home_env(tmp_path, {"SPARK_HOME": "/opt/spark-4.2.0-bin-hadoop3"}) == {}
