"""The local Kafka broker's configuration, cluster ids and jar fetching, without starting it."""

from __future__ import annotations

import base64
import json

import pytest

from keyshift.errors import StackError
from keyshift.settings import Settings
from keyshift.stack import kafka, maven


def _properties(text: str) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return {key: value for key, value in pairs}


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings(home=tmp_path / "state", kafka_port=19092, kafka_controller_port=19093)


def test_server_properties_single_node_kraft(settings):
    props = _properties(kafka.render_server_properties(settings))

    assert props["process.roles"] == "broker,controller"
    assert props["node.id"] == "1"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:19092"
    assert props["controller.listener.names"] == "CONTROLLER"
    # dynamic quorum of one: the storage is formatted with --standalone
    assert props["controller.quorum.bootstrap.servers"] == "127.0.0.1:19093"
    assert "controller.quorum.voters" not in props
    assert props["log.dirs"] == str(settings.home / "kafka" / "data")
    assert props["group.initial.rebalance.delay.ms"] == "0"
    assert props["auto.create.topics.enable"] == "false"


@pytest.mark.parametrize(
    "key",
    [
        "offsets.topic.replication.factor",
        "transaction.state.log.replication.factor",
        "transaction.state.log.min.isr",
        "share.coordinator.state.topic.replication.factor",
        "share.coordinator.state.topic.min.isr",
    ],
)
def test_internal_topics_fit_one_broker(settings, key):
    assert _properties(kafka.render_server_properties(settings))[key] == "1"


def test_a_three_node_cluster_has_a_static_quorum_and_production_replication(tmp_path):
    settings = Settings(home=tmp_path / "state", kafka_port=19092, kafka_controller_port=19093, kafka_brokers=3)
    assert settings.kafka_nodes == [(1, 19092, 19093), (2, 19102, 19103), (3, 19112, 19113)]
    assert settings.bootstrap_servers == "127.0.0.1:19092,127.0.0.1:19102,127.0.0.1:19112"
    assert settings.kafka_replication == (3, 2)
    for node, client, controller in settings.kafka_nodes:
        props = _properties(kafka.render_server_properties(settings, node))
        assert props["node.id"] == str(node)
        assert props["listeners"] == f"PLAINTEXT://127.0.0.1:{client},CONTROLLER://127.0.0.1:{controller}"
        assert props["controller.quorum.voters"] == "1@127.0.0.1:19093,2@127.0.0.1:19103,3@127.0.0.1:19113"
        assert "controller.quorum.bootstrap.servers" not in props  # static quorum: formatted without --standalone
        assert props["log.dirs"] == str(settings.home / "kafka-cluster" / f"node-{node}" / "data")
        assert props["default.replication.factor"] == props["offsets.topic.replication.factor"] == "3"
        assert props["min.insync.replicas"] == props["transaction.state.log.min.isr"] == "2"
        assert kafka.process_name(settings, node) == f"kafka-{node}"
    assert kafka.process_name(Settings(home=tmp_path)) == "kafka"  # the single node keeps its name and folder
    with pytest.raises(Exception, match="node 4"):
        kafka.render_server_properties(settings, 4)


def test_sasl_is_off_by_default_and_clients_get_no_security_options(settings):
    from keyshift import kafka_clients

    props = _properties(kafka.render_server_properties(settings))
    assert props["listener.security.protocol.map"] == "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
    assert not [key for key in props if "sasl" in key]
    assert kafka_clients.client_options(settings) == {}
    assert kafka_clients.spark_options(settings) == {}


def test_sasl_plain_secures_both_listeners_with_one_user(settings):
    from keyshift import kafka_clients

    secured = Settings(home=settings.home, kafka_port=19092, kafka_controller_port=19093,
                       kafka_sasl_username="ks", kafka_sasl_password="p4ss word")
    props = _properties(kafka.render_server_properties(secured))

    assert props["listeners"] == "SASL_PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:19093"
    assert props["advertised.listeners"] == "SASL_PLAINTEXT://127.0.0.1:19092"
    assert props["listener.security.protocol.map"] == "SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:SASL_PLAINTEXT"
    assert props["sasl.enabled.mechanisms"] == "PLAIN"
    assert props["sasl.mechanism.inter.broker.protocol"] == "PLAIN"
    assert props["sasl.mechanism.controller.protocol"] == "PLAIN"
    jaas = ('org.apache.kafka.common.security.plain.PlainLoginModule required '
            'username="ks" password="p4ss word" user_ks="p4ss word";')
    assert props["listener.name.sasl_plaintext.plain.sasl.jaas.config"] == jaas
    assert props["listener.name.controller.plain.sasl.jaas.config"] == jaas
    assert kafka_clients.client_options(secured) == {
        "security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN",
        "sasl_plain_username": "ks", "sasl_plain_password": "p4ss word",
    }
    assert kafka_clients.spark_options(secured) == {
        "kafka.security.protocol": "SASL_PLAINTEXT", "kafka.sasl.mechanism": "PLAIN",
        "kafka.sasl.jaas.config": 'org.apache.kafka.common.security.plain.PlainLoginModule required '
                                  'username="ks" password="p4ss word";',
    }


@pytest.mark.parametrize(
    "username, password, match",
    [
        ("ks", None, "KEYSHIFT_KAFKA_SASL_PASSWORD"),  # half set: which one is missing
        (None, "pw", "KEYSHIFT_KAFKA_SASL_USERNAME"),
        ("ks", 'a"b', "double quote"),  # JAAS cannot quote it
        ("k s", "pw", "letters, digits"),  # becomes the option name user_<name>
    ],
)
def test_bad_sasl_settings_are_configuration_errors(settings, username, password, match):
    from keyshift.errors import ConfigurationError

    bad = Settings(home=settings.home, kafka_sasl_username=username, kafka_sasl_password=password)
    with pytest.raises(ConfigurationError, match=match):
        kafka.render_server_properties(bad)


def test_every_listener_is_on_loopback_by_default():
    props = _properties(kafka.render_server_properties(Settings()))
    for listener in props["listeners"].split(","):
        assert listener.split("://")[1].startswith("127.0.0.1:")


def test_cluster_ids_are_kafka_uuids():
    ids = {kafka.new_cluster_id() for _ in range(200)}
    assert len(ids) == 200
    for cluster_id in ids:
        assert len(cluster_id) == 22
        assert not cluster_id.startswith("-")
        assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16


def test_paths_live_under_home_and_cache(settings):
    assert kafka.config_file(settings) == settings.home / "kafka" / "server.properties"
    assert kafka.jars_dir(settings) == settings.cache / "kafka-4.3.0"
    assert kafka.jars_dir(settings).is_relative_to(settings.home)  # cache defaults to home/cache


def test_formatted_storage_is_detected_and_not_formatted_again(settings, monkeypatch):
    data = kafka.data_dir(settings)
    data.mkdir(parents=True)
    (data / "meta.properties").write_text("node.id=1\ncluster.id=abcdefghijklmnopqrstuv\nversion=1\n")
    monkeypatch.setattr(kafka.subprocess, "run", lambda *a, **k: pytest.fail("formatted twice"))

    assert kafka.is_formatted(settings)
    assert kafka.format_storage(settings) == "abcdefghijklmnopqrstuv"


def test_probe_of_a_closed_port_is_a_stack_error(settings):
    with pytest.raises(StackError, match="nothing listens"):
        kafka.probe(Settings(home=settings.home, kafka_port=1))
    assert kafka.is_healthy(Settings(home=settings.home, kafka_port=1)) is False


def test_a_complete_fetch_is_reused_without_maven(tmp_path, monkeypatch):
    pom = tmp_path / "pom.xml"
    pom.write_text("<project/>")
    dest = tmp_path / "jars"
    dest.mkdir()
    (dest / "a-1.jar").write_bytes(b"jar")
    (dest / maven.MANIFEST).write_text(
        json.dumps({"pom_sha256": maven._pom_digest(pom), "jars": ["a-1.jar"]})
    )
    monkeypatch.setattr(maven.shutil, "which", lambda name: pytest.fail("maven called"))

    assert maven.copy_dependencies(pom, dest) == [dest / "a-1.jar"]


@pytest.mark.parametrize(
    "change",
    [
        "pom edited",  # the manifest was written for other pom content
        "jar deleted",  # a jar the manifest names is gone
        "no manifest",  # an interrupted fetch never wrote one
    ],
)
def test_an_incomplete_or_outdated_fetch_is_fetched_again(tmp_path, change):
    pom = tmp_path / "pom.xml"
    pom.write_text("<project/>")
    dest = tmp_path / "jars"
    dest.mkdir()
    (dest / "a-1.jar").write_bytes(b"jar")
    (dest / maven.MANIFEST).write_text(
        json.dumps({"pom_sha256": maven._pom_digest(pom), "jars": ["a-1.jar"]})
    )
    if change == "pom edited":
        pom.write_text("<project><!-- new --></project>")
    elif change == "jar deleted":
        (dest / "a-1.jar").unlink()
    else:
        (dest / maven.MANIFEST).unlink()

    assert maven.fetched_jars(pom, dest) is None


def test_missing_maven_says_how_to_install_it(tmp_path, monkeypatch):
    pom = tmp_path / "pom.xml"
    pom.write_text("<project/>")
    monkeypatch.setattr(maven.shutil, "which", lambda name: None)
    with pytest.raises(StackError, match="apt-get install -y maven"):
        maven.copy_dependencies(pom, tmp_path / "jars")
