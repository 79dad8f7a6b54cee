"""Apache Kafka on loopback: one node (the default) or a cluster of `kafka_brokers` nodes, each a
broker and a KRaft controller in one JVM.

The broker's jars come from Maven Central through `infra/kafka/pom.xml` into the cache
(`<cache>/kafka-4.3.0/`, fetched once). Its files live under `<home>/kafka/`: `server.properties`
(rendered from the settings on every start) and `data/` (the log directory, formatted once with a
new cluster id). It runs as `java -cp '<jars>/*' kafka.Kafka server.properties` with a modest heap,
logging to `<home>/logs/kafka.log`. Health is a real metadata request made with kafka-python.

Changing `kafka_controller_port` after the first start means deleting `<home>/kafka/data` (the
controller's address is recorded when the storage is formatted).

A cluster (`KEYSHIFT_KAFKA_BROKERS=3`) keeps its nodes apart from the single node's files: node i
in `<home>/kafka-cluster/node-<i>/`, process `kafka-<i>`, listening 10 * (i - 1) ports above the
single node's (`Settings.kafka_nodes`), with a static quorum of all nodes
(`controller.quorum.voters`), every node formatted with one cluster id, and replication factor
min(3, nodes) and `min.insync.replicas` min(2, nodes) for the internal topics and as the brokers'
defaults (`Settings.kafka_replication`), Kafka's production settings for three brokers.
"""

from __future__ import annotations

import base64
import logging
import os
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from keyshift import kafka_clients
from keyshift.errors import ConfigurationError, StackError
from keyshift.settings import PROJECT_ROOT, Settings
from keyshift.stack import maven, process
from keyshift.stack.process import write_private
from keyshift.stack.service import (
    BLOCKED,
    EXTERNAL,
    HEALTHY,
    STOPPED,
    UNHEALTHY,
    ProcessState,
    ServiceStatus,
)

log = logging.getLogger("keyshift.stack.kafka")

KAFKA_VERSION = "4.3.0"
"""The broker version `infra/kafka/pom.xml` fetches."""
NAME = "kafka"
"""The process name of the broker (pid file `run/kafka.pid`, log `logs/kafka.log`)."""
NODE_ID = 1
"""The single node's id, as broker and as controller (node 1 of a cluster)."""
POM = PROJECT_ROOT / "infra" / "kafka" / "pom.xml"
"""The Maven project that names the broker's runtime jars."""
LOG4J2_CONFIG = PROJECT_ROOT / "infra" / "kafka" / "log4j2.properties"
"""The broker's logging configuration: everything to stdout, i.e. to `logs/kafka.log`."""
HEAP = "1g"
"""Maximum broker heap (-Xmx); plenty for a development broker, small beside Spark."""


def jars_dir(settings: Settings) -> Path:
    """Folder of the broker's jars in the cache: `<cache>/kafka-<version>`."""
    return settings.cache / f"kafka-{KAFKA_VERSION}"


def is_cluster(settings: Settings) -> bool:
    """True for a cluster of Kafka nodes (`kafka_brokers` > 1)."""
    return settings.kafka_brokers > 1


def process_name(settings: Settings, node: int = NODE_ID) -> str:
    """The process name of node `node`: `kafka` for the single node, `kafka-<node>` in a cluster."""
    return f"{NAME}-{node}" if is_cluster(settings) else NAME


def kafka_dir(settings: Settings, node: int = NODE_ID) -> Path:
    """Node `node`'s folder in the state directory: `<home>/kafka`, or `<home>/kafka-cluster/node-<node>`."""
    return settings.home / "kafka-cluster" / f"node-{node}" if is_cluster(settings) else settings.home / "kafka"


def data_dir(settings: Settings, node: int = NODE_ID) -> Path:
    """Node `node`'s log directory (`log.dirs`): `<its folder>/data`."""
    return kafka_dir(settings, node) / "data"


def config_file(settings: Settings, node: int = NODE_ID) -> Path:
    """Node `node`'s rendered configuration: `<its folder>/server.properties`."""
    return kafka_dir(settings, node) / "server.properties"


def fetch(settings: Settings) -> list[Path]:
    """Fetch the broker's jars from Maven Central into the cache, once; return their paths.

    Raises:
        StackError: when Maven is missing or fails.
    """
    return maven.copy_dependencies(POM, jars_dir(settings))


def render_server_properties(settings: Settings, node: int = NODE_ID) -> str:
    """Node `node`'s `server.properties` for the settings: a combined broker and controller.

    The client listener on `kafka_host:kafka_port` (PLAINTEXT, or SASL_PLAINTEXT with the PLAIN
    mechanism when `settings.kafka_sasl`), CONTROLLER on `kafka_host:kafka_controller_port`
    (PLAINTEXT, or SASL_PLAINTEXT/PLAIN too), a dynamic quorum of this one node
    (`controller.quorum.bootstrap.servers`, so the storage is formatted with `--standalone`),
    replication factor and min ISR 1 for every internal topic, no initial rebalance delay, topics
    created explicitly only (no auto-creation), data under `<home>/kafka/data`. In a cluster
    (module docstring): node `node`'s ports, a static quorum of every node
    (`controller.quorum.voters`), and the replication of `Settings.kafka_replication`.

    With SASL, each listener's `listener.name.<listener>.plain.sasl.jaas.config` holds the one
    user (`user_<name>="<password>"`, what the broker accepts) and the same login for the broker's
    own connections to itself and to its controller; the file then holds a password (`start`
    writes it with mode 0600).

    Raises:
        ConfigurationError: for half-set SASL credentials or a value JAAS cannot quote.
    """
    host = settings.kafka_host
    ports = {i: (client_port, controller_port) for i, client_port, controller_port in settings.kafka_nodes}
    if node not in ports:
        raise ConfigurationError(f"Kafka node {node} is not one of the {settings.kafka_brokers} node(s)")
    plain = f"{host}:{ports[node][0]}"
    controller = f"{host}:{ports[node][1]}"
    replication, min_isr = settings.kafka_replication
    credentials = kafka_clients.sasl_credentials(settings)
    client = kafka_clients.SECURITY_PROTOCOL if credentials else "PLAINTEXT"  # listener name = protocol
    entries = {
        "process.roles": "broker,controller",
        "node.id": str(node),
        **({"controller.quorum.voters": ",".join(f"{i}@{host}:{c}" for i, (_, c) in ports.items())} if is_cluster(settings)
           else {"controller.quorum.bootstrap.servers": controller}),
        "listeners": f"{client}://{plain},CONTROLLER://{controller}",
        "advertised.listeners": f"{client}://{plain}",
        "inter.broker.listener.name": client,
        "controller.listener.names": "CONTROLLER",
        "listener.security.protocol.map": f"{client}:{client},CONTROLLER:{client}",
    }
    if credentials:
        username, password = credentials
        if not all(c.isalnum() or c in "_-." for c in username):
            raise ConfigurationError(
                "KEYSHIFT_KAFKA_SASL_USERNAME must be letters, digits, '_', '-' or '.' "
                f"(it becomes the JAAS option user_<name>); got {username!r}"
            )
        user = kafka_clients.jaas_value(username, "KEYSHIFT_KAFKA_SASL_USERNAME")
        secret = kafka_clients.jaas_value(password, "KEYSHIFT_KAFKA_SASL_PASSWORD")
        jaas = (
            f"{kafka_clients.PLAIN_LOGIN_MODULE} required username={user} password={secret} "
            f"user_{username}={secret};"
        )
        entries |= {
            "sasl.enabled.mechanisms": kafka_clients.SASL_MECHANISM,
            "sasl.mechanism.inter.broker.protocol": kafka_clients.SASL_MECHANISM,
            "sasl.mechanism.controller.protocol": kafka_clients.SASL_MECHANISM,
            f"listener.name.{client.lower()}.plain.sasl.jaas.config": jaas,
            "listener.name.controller.plain.sasl.jaas.config": jaas,
        }
    entries |= {
        "log.dirs": str(data_dir(settings, node)),
        "num.partitions": "1",
        "auto.create.topics.enable": "false",
        "default.replication.factor": str(replication),
        "min.insync.replicas": str(min_isr),
        "offsets.topic.replication.factor": str(replication),
        "transaction.state.log.replication.factor": str(replication),
        "transaction.state.log.min.isr": str(min_isr),
        "share.coordinator.state.topic.replication.factor": str(replication),
        "share.coordinator.state.topic.min.isr": str(min_isr),
        "group.initial.rebalance.delay.ms": "0",
        "log.retention.hours": "168",
    }
    lines = [
        "# Rendered by keyshift (keyshift/stack/kafka.py) on every `keyshift stack up`;",
        "# edits here are overwritten. " + (f"Node {node} of {settings.kafka_brokers}" if is_cluster(settings) else "Single node")
        + ": broker and controller in one process.",
    ]
    lines += [f"{key}={value}" for key, value in entries.items()]
    return "\n".join(lines) + "\n"


def new_cluster_id() -> str:
    """A fresh Kafka cluster id: 16 random bytes, URL-safe base64 without padding (22 chars).

    Like Kafka's own `Uuid.randomUuid()`, it never starts with '-' (a command line would take it
    for an option).
    """
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode("ascii").rstrip("=")
        if not text.startswith("-"):
            return text


def java_executable() -> str:
    """The `java` to run the broker with: `$JAVA_HOME/bin/java`, else `java` on PATH.

    Raises:
        StackError: when there is no Java (Kafka 4 needs Java 17 or newer).
    """
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise StackError(
            "java is not on PATH; Kafka 4 needs Java 17+: install it with "
            "`apt-get install -y openjdk-17-jre-headless` or set JAVA_HOME"
        )
    return found


def _classpath(settings: Settings) -> str:
    return str(jars_dir(settings) / "*")  # the JVM expands the wildcard itself


def is_formatted(settings: Settings, node: int = NODE_ID) -> bool:
    """True when node `node`'s log directory has been formatted (it holds `meta.properties`)."""
    return (data_dir(settings, node) / "meta.properties").is_file()


def format_storage(settings: Settings, node: int = NODE_ID, cluster_id: str | None = None) -> str:
    """Format node `node`'s storage once; return its cluster id.

    Runs `kafka.tools.StorageTool format -t ID -c server.properties`, with `--standalone` for
    the single node (a dynamic quorum of one), without for a cluster's static quorum. Does
    nothing (and returns the existing cluster id) when the storage is already formatted.

    Args:
        cluster_id: the id to format with (every node of a cluster shares one); None: a new one.

    Raises:
        StackError: when the storage tool fails (its output is in the message).
    """
    if is_formatted(settings, node):
        return _existing_cluster_id(settings, node)
    cluster_id = cluster_id or new_cluster_id()
    argv = [
        java_executable(), "-Xmx256m",
        f"-Dlog4j2.configurationFile={LOG4J2_CONFIG}",
        "-cp", _classpath(settings), "kafka.tools.StorageTool",
        "format", "-t", cluster_id, "-c", str(config_file(settings, node)),
    ] + ([] if is_cluster(settings) else ["--standalone"])  # fmt: skip
    log.info("formatting Kafka storage in %s (cluster id %s)", data_dir(settings, node), cluster_id)
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if result.returncode != 0:
        output = (result.stdout + result.stderr).strip()[-3000:]
        raise StackError(f"formatting Kafka storage failed (exit {result.returncode}):\n{output}")
    return cluster_id


def _existing_cluster_id(settings: Settings, node: int = NODE_ID) -> str:
    for line in (data_dir(settings, node) / "meta.properties").read_text().splitlines():
        if line.startswith("cluster.id="):
            return line.split("=", 1)[1].strip()
    return ""


def any_node_listens(settings: Settings) -> bool:
    """True when a Kafka node accepts TCP connections on its client port (`Settings.kafka_nodes`)."""
    return any(process.port_open(settings.kafka_host, client) for _, client, _ in settings.kafka_nodes)


def broker_unreachable(settings: Settings, exc: Exception) -> StackError:
    """The error to raise when no broker answers at `settings.bootstrap_servers`.

    The fix it names: the SASL settings when the broker refused the login, or when something
    listens there but never completed a request (kafka-python reports a refused SASL login, or a
    PLAINTEXT client at a SASL listener, only as a bootstrap timeout); else `keyshift stack up`.
    """
    where = settings.bootstrap_servers
    sasl_fix = (
        "set KEYSHIFT_KAFKA_SASL_USERNAME and KEYSHIFT_KAFKA_SASL_PASSWORD to the broker's user"
        if not settings.kafka_sasl
        else "check KEYSHIFT_KAFKA_SASL_USERNAME and KEYSHIFT_KAFKA_SASL_PASSWORD"
    )
    from kafka import errors as kafka_errors

    if isinstance(exc, kafka_errors.SaslAuthenticationFailedError):
        return StackError(f"Kafka at {where} refused the login ({exc}); {sasl_fix}")
    if not isinstance(exc, ConnectionRefusedError) and any_node_listens(settings):
        return StackError(
            f"Kafka at {where} accepts connections but answered no request ({exc}); if it requires "
            f"a login (SASL), {sasl_fix}; else see its log (`keyshift stack status` names it)"
        )
    return StackError(f"no Kafka broker answers at {where} ({exc}); start the stack with `keyshift stack up`")


def check_broker(settings: Settings) -> None:
    """Fail fast when nothing listens at `settings.bootstrap_servers` (a TCP connect, < 1 s).

    kafka-python would otherwise retry for `BOOTSTRAP_TIMEOUT_MS` before giving up.

    Raises:
        StackError: nothing accepts connections there (with the fix: `keyshift stack up`).
    """
    if not any_node_listens(settings):
        raise broker_unreachable(settings, ConnectionRefusedError("nothing listens there"))


@dataclass(frozen=True)
class KafkaHealth:
    """What a metadata request to the broker returned.

    Attributes:
        cluster_id: the cluster's id.
        broker_ids: ids of the brokers in the cluster metadata.
        topics: names of the topics the broker lists (internal ones excluded).
    """

    cluster_id: str
    broker_ids: tuple[int, ...]
    topics: tuple[str, ...]


def probe(settings: Settings, *, timeout_s: float = 5.0) -> KafkaHealth:
    """Ask the broker for its cluster metadata (DescribeCluster and Metadata requests).

    Args:
        settings: where the broker is (`bootstrap_servers`).
        timeout_s: seconds allowed for connecting and for each request.

    Returns:
        The cluster id, broker ids and topic names.

    Raises:
        StackError: when the broker cannot be reached or answers with an error.
    """
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    if not any_node_listens(settings):
        raise StackError(f"nothing listens on {settings.bootstrap_servers}")
    timeout_ms = int(timeout_s * 1000)
    try:
        admin = KafkaAdminClient(
            bootstrap_servers=settings.bootstrap_servers,
            client_id="keyshift-stack-health",
            request_timeout_ms=timeout_ms,
            bootstrap_timeout_ms=timeout_ms,
            **kafka_clients.client_options(settings),
        )
    except KafkaError as exc:
        raise StackError(f"Kafka on {settings.bootstrap_servers} did not answer: {exc}") from exc
    try:
        cluster = admin.describe_cluster()
        topics = admin.list_topics()
    except KafkaError as exc:
        raise StackError(f"Kafka on {settings.bootstrap_servers} failed a request: {exc}") from exc
    finally:
        admin.close()
    brokers = tuple(int(b["broker_id"]) for b in cluster.get("brokers", []))
    if not brokers:
        raise StackError(f"Kafka on {settings.bootstrap_servers} reports no broker yet")
    return KafkaHealth(
        cluster_id=str(cluster.get("cluster_id", "")),
        broker_ids=brokers,
        topics=tuple(sorted(t for t in topics if not t.startswith("__"))),
    )


def is_healthy(settings: Settings, *, timeout_s: float = 5.0) -> bool:
    """True when the cluster answers a metadata request within `timeout_s` seconds with all
    `kafka_brokers` brokers in it."""
    try:
        health = probe(settings, timeout_s=timeout_s)
    except StackError as exc:
        log.debug("kafka not healthy: %s", exc)
        return False
    if len(health.broker_ids) < settings.kafka_brokers:
        log.debug("kafka not healthy: brokers %s of %d", health.broker_ids, settings.kafka_brokers)
        return False
    return True


def start(settings: Settings) -> bool:
    """Start the broker unless it runs already; do not wait for it (see `wait_healthy`).

    Fetches the jars (once), renders `server.properties`, formats the storage (once) and starts
    the JVM detached. When a broker that keyshift did not start already answers on the port, it
    is reused and nothing starts.

    Returns:
        True when a broker process was started, False when one was already there.

    Raises:
        StackError: when the port is taken by something that is not a healthy broker (or one
            refusing the settings' login), when keyshift's broker runs with another configuration
            than the settings render (restart it), or Java, Maven or the storage tool fail.
        ConfigurationError: for bad SASL settings.
    """
    home = settings.home
    nodes = [node for node, _, _ in settings.kafka_nodes]
    running = [node for node in nodes if process.is_running(home, process_name(settings, node))]
    for node in running:
        name = process_name(settings, node)
        process.check_config_unchanged(home, name, config_file(settings, node), render_server_properties(settings, node))
        log.info("%s already running (pid %d)", name, process.read_record(home, name).pid)
    if len(running) == len(nodes):
        return False
    for node, client_port, controller_port in settings.kafka_nodes:
        if node in running:
            continue
        for port in (client_port, controller_port):
            if process.port_open(settings.kafka_host, port):
                owner = process.port_owner(port)
                who = owner.describe() if owner else "owner unknown"
                if not running and port == settings.kafka_port and is_healthy(settings):
                    log.info("a Kafka broker already answers on %s (%s); reusing it",
                             settings.bootstrap_servers, who)
                    return False
                login = (
                    " (if it is a Kafka broker, its SASL/PLAIN login must match KEYSHIFT_KAFKA_SASL_USERNAME "
                    "and KEYSHIFT_KAFKA_SASL_PASSWORD, set or unset alike)"
                    if port == client_port
                    else ""
                )
                raise StackError(
                    f"port {settings.kafka_host}:{port} is in use by another process ({who}){login}; stop "
                    "it, or choose other ports with KEYSHIFT_KAFKA_PORT / KEYSHIFT_KAFKA_CONTROLLER_PORT"
                )
    fetch(settings)
    java = java_executable()
    cluster_id = next((_existing_cluster_id(settings, n) for n in nodes if is_formatted(settings, n)), None) or new_cluster_id()
    for node in nodes:
        if node in running:
            continue
        kafka_dir(settings, node).mkdir(parents=True, exist_ok=True)
        write_private(config_file(settings, node), render_server_properties(settings, node))
        format_storage(settings, node, cluster_id)
        argv = [
            java, "-Xms256m", f"-Xmx{HEAP}", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
            "-Djava.awt.headless=true", f"-Dlog4j2.configurationFile={LOG4J2_CONFIG}",
            "-cp", _classpath(settings), "kafka.Kafka", str(config_file(settings, node)),
        ]  # fmt: skip
        process.start(home, process_name(settings, node), argv, cwd=kafka_dir(settings, node))
    return True


def wait_healthy(settings: Settings, *, timeout_s: float) -> float:
    """Wait until the broker answers a metadata request; return the seconds waited.

    Raises:
        StackError: after `timeout_s` seconds, or as soon as the broker process exits; the
            message names `<home>/logs/kafka.log`.
    """
    first = process_name(settings)
    ours = process.read_record(settings.home, first) is not None
    names = [process_name(settings, node) for node, _, _ in settings.kafka_nodes]
    return process.wait_until(
        lambda: is_healthy(settings, timeout_s=3.0),
        timeout_s=timeout_s,
        what=f"kafka on {settings.bootstrap_servers}" + (f" ({settings.kafka_brokers} brokers)" if is_cluster(settings) else ""),
        log_path=process.log_file(settings.home, first),
        alive=(lambda: all(process.is_running(settings.home, name) for name in names)) if ours else None,
    )


def stop(settings: Settings) -> bool:
    """Stop the broker(s) keyshift started (a controlled shutdown; SIGKILL after 60 s), the
    single node's and a cluster's alike. A cluster's nodes are stopped together: stopped one
    after another, the last ones lose the KRaft quorum their controlled shutdown waits for, and
    hang until the SIGKILL.

    Returns:
        True when a running broker was stopped.
    """
    from concurrent.futures import ThreadPoolExecutor

    run = process.run_dir(settings.home)
    names = sorted({NAME} | {p.stem for p in run.glob(f"{NAME}-*.pid")} if run.exists() else {NAME}, reverse=True)
    with ThreadPoolExecutor(max_workers=len(names)) as pool:
        return any(list(pool.map(lambda name: process.stop(settings.home, name, timeout_s=60.0), names)))


def status(settings: Settings) -> ServiceStatus:
    """The broker's state, address and process, with its cluster id when it answers."""
    names = [process_name(settings, node) for node, _, _ in settings.kafka_nodes]
    records = [process.running_record(settings.home, name) for name in names]
    procs = tuple(ProcessState(name, record.pid if record else None, str(process.log_file(settings.home, name)))
                  for name, record in zip(names, records))
    record = records[0]
    address = settings.bootstrap_servers
    try:
        health = probe(settings, timeout_s=3.0)
        detail = f"cluster {health.cluster_id}, {len(health.topics)} topics"
        if is_cluster(settings):
            detail += f", brokers {list(health.broker_ids)} of {settings.kafka_brokers}"
        state = HEALTHY if record else EXTERNAL
        if state == HEALTHY and not all(records):
            state = UNHEALTHY
        if state == EXTERNAL:
            owner = process.port_owner(settings.kafka_port)
            detail += f" ({owner.describe() if owner else 'not started by this keyshift'})"
        else:
            detail += f", Kafka {KAFKA_VERSION}"
    except StackError as exc:
        detail = str(exc)
        if record:
            state = UNHEALTHY
        elif any_node_listens(settings):
            state = BLOCKED
        else:
            state, detail = STOPPED, ""
    return ServiceStatus(NAME, state, address, procs, detail)

