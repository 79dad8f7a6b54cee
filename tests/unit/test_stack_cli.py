"""`keyshift stack`: service selection and every command's help with its defaults."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from keyshift import stack
from keyshift.cli.stack import command
from keyshift.errors import ConfigurationError


@pytest.mark.parametrize(
    ("only", "expected"),
    [
        (None, ("redis", "kafka", "airflow")),  # all, in start order
        ("", ("redis", "kafka", "airflow")),  # an empty option means all
        ("airflow,kafka", ("kafka", "airflow")),  # start order, not the order given
        (" redis , ", ("redis",)),  # blanks and trailing commas are ignored
        (["kafka"], ("kafka",)),  # an iterable works too
        ("airflow,spark,redis", ("redis", "spark", "airflow")),  # the cluster, when named, starts before Airflow
    ],
)
def test_select(only, expected):
    assert stack.select(only) == expected


def test_the_spark_cluster_hdfs_and_s3_are_started_only_when_asked_for():
    assert not {"spark", "hdfs", "s3"} & set(stack.select(None))
    assert stack.select(None, cluster=True) == ("redis", "kafka", "hdfs", "s3", "spark", "airflow")
    assert stack.select("kafka", cluster=True) == ("kafka",)  # --only wins


def test_the_cluster_processes_take_the_settings(tmp_path):
    from keyshift.settings import Settings
    from keyshift.stack import spark_cluster

    settings = Settings(home=tmp_path, spark_master_port=17077, spark_master_ui_port=18091, spark_workers=3,
                        spark_worker_cores=2, spark_worker_memory="1g")
    master = spark_cluster.master_argv(settings)
    assert master[1:] == [spark_cluster.MASTER_CLASS, "--host", "127.0.0.1", "--port", "17077", "--webui-port", "18091"]
    worker = spark_cluster.worker_argv(settings, 2)
    assert worker[1:4] == [spark_cluster.WORKER_CLASS, "spark://127.0.0.1:17077", "--host"]
    assert worker[worker.index("--cores") + 1] == "2" and worker[worker.index("--memory") + 1] == "1g"
    assert worker[worker.index("--webui-port") + 1] == "18094"  # the master's UI port + 1 + index
    assert worker[worker.index("--work-dir") + 1] == str(tmp_path / "spark" / "worker-2")
    assert not spark_cluster.is_healthy(settings)  # nothing answers there


def test_select_rejects_unknown_services():
    with pytest.raises(ConfigurationError, match="zookeeper"):
        stack.select("kafka,zookeeper")


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (["--help"], ["up", "down", "status", "fetch"]),
        (["up", "--help"], ["--only", "--timeout", "default: 300", "default: (all)", "--cluster"]),
        (["down", "--help"], ["--only", "default: (all)", "keyshift started"]),
        (["status", "--help"], ["--only"]),
        (["fetch", "--help"], ["Kafka", "Spark"]),
    ],
)
def test_every_command_has_help_with_defaults(args, shown):
    result = CliRunner().invoke(command, args)
    assert result.exit_code == 0, result.output
    for text in shown:
        assert text in result.output


def test_up_rejects_a_timeout_below_one_second():
    result = CliRunner().invoke(command, ["up", "--timeout", "0"])
    assert result.exit_code != 0
    assert "--timeout" in result.output


def test_the_hdfs_process_takes_its_port_and_fixed_heap(tmp_path, monkeypatch):
    from keyshift.settings import Settings
    from keyshift.stack import hdfs

    monkeypatch.setattr(hdfs, "classpath", lambda settings: "CP")
    settings = Settings(home=tmp_path, hdfs_port=28020)
    argv = hdfs.argv(settings)
    assert argv[0] == "java" and "-Xmx256m" in argv and argv[argv.index("-cp") + 1] == "CP"
    assert argv[-4:] == ["MiniHdfs", str(tmp_path / "hdfs" / "data"), "28020", str(tmp_path / "hdfs" / "ready")]
    assert hdfs.url(settings) == "hdfs://127.0.0.1:28020"


def test_s3a_settings_come_only_with_an_s3a_checkpoint_location(tmp_path):
    """S3A's jars and `spark.hadoop.fs.s3a.*` are added for an `s3a://` location only; an endpoint
    of one's own gets path-style access, no TLS for http and no 100-continue; keys only when both
    are set."""
    from keyshift.settings import Settings
    from keyshift.stack import s3a

    assert s3a.spark_conf(Settings(home=tmp_path, checkpoint_location="hdfs://nn:8020/cp")) == {}
    assert s3a.spark_conf(Settings(home=tmp_path)) == {}
    aws = s3a.spark_conf(Settings(home=tmp_path, checkpoint_location="s3a://bucket/cp"))
    assert aws == {}  # AWS's endpoints and the default credential chain: nothing to set
    local = s3a.spark_conf(Settings(home=tmp_path, checkpoint_location="s3a://keyshift/cp", s3_endpoint="http://127.0.0.1:9000",
                                    s3_access_key="ak", s3_secret_key="sk"))
    assert local["spark.hadoop.fs.s3a.endpoint"] == "http://127.0.0.1:9000"
    assert local["spark.hadoop.fs.s3a.path.style.access"] == "true"
    assert local["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "false"
    assert local["spark.hadoop.fs.s3a.connection.expect.continue"] == "false"
    assert (local["spark.hadoop.fs.s3a.access.key"], local["spark.hadoop.fs.s3a.secret.key"]) == ("ak", "sk")
    tls = s3a.spark_conf(Settings(home=tmp_path, checkpoint_location="s3a://b/cp", s3_endpoint="https://minio:9000", s3_access_key="ak"))
    assert tls["spark.hadoop.fs.s3a.connection.ssl.enabled"] == "true" and "spark.hadoop.fs.s3a.access.key" not in tls


def test_a_taken_port_is_refused_with_its_setting_named():
    """A service's start refuses a port that accepts connections, naming the setting that moves it."""
    import socket

    import pytest

    from keyshift.errors import StackError
    from keyshift.stack import process

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        with pytest.raises(StackError, match=f"127.0.0.1:{port} is in use .*KEYSHIFT_S3_PORT"):
            process.refuse_taken_port(port, "KEYSHIFT_S3_PORT")
    process.refuse_taken_port(port, "KEYSHIFT_S3_PORT")  # closed now: no error
