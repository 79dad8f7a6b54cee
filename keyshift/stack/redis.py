"""The coordinator: Debian's redis-server on loopback, supervised by keyshift (not by systemd).

Runs `redis-server <home>/redis/redis.conf` in the foreground (`daemonize no`; keyshift keeps its
pid file), bound to `redis_host` (127.0.0.1) on `redis_port`, with the append-only file on and its data in
`<home>/redis/`. Health is a PING through redis-py. When `redis-server` is missing and keyshift
runs as root, it installs Debian's package with apt-get; otherwise it says how to.

With `KEYSHIFT_REDIS_PASSWORD` set, the config gets `requirepass` (the file is then written with
mode 0600, and the password is never on the command line) and every client of keyshift logs in
through `settings.redis_url`.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from keyshift.errors import ConfigurationError, StackError
from keyshift.settings import Settings
from keyshift.stack import process
from keyshift.stack.service import (
    BLOCKED,
    EXTERNAL,
    HEALTHY,
    STOPPED,
    UNHEALTHY,
    ProcessState,
    ServiceStatus,
)

if TYPE_CHECKING:
    import redis as redis_py

log = logging.getLogger("keyshift.stack.redis")

NAME = "redis"
"""The process name of the server (pid file `run/redis.pid`, log `logs/redis.log`)."""
DEBIAN_PACKAGE = "redis-server"


def redis_dir(settings: Settings) -> Path:
    """The server's folder (config, AOF, RDB snapshot): `<home>/redis`."""
    return settings.home / "redis"


def config_file(settings: Settings) -> Path:
    """The rendered server configuration: `<home>/redis/redis.conf`."""
    return redis_dir(settings) / "redis.conf"


def render_config(settings: Settings) -> str:
    """The `redis.conf` for the settings.

    `redis_host` (loopback by default), `redis_port`, protected mode, foreground (`daemonize no`, `supervised no`),
    log to stdout (keyshift appends it to `logs/redis.log`), append-only file with an fsync every
    second, RDB snapshots as Redis's defaults, data in `<home>/redis`; `requirepass` when
    `settings.redis_password` is set.

    Raises:
        ConfigurationError: for a password with a control character (redis.conf cannot hold it).
    """
    lines = [
        "# Rendered by keyshift (keyshift/stack/redis.py) on every `keyshift stack up`;",
        "# edits here are overwritten.",
        f"bind {settings.redis_host}",
        f"port {settings.redis_port}",
        "protected-mode yes",
        "daemonize no",
        "supervised no",
        'logfile ""',
        "loglevel notice",
        f'dir "{redis_dir(settings)}"',
        "dbfilename dump.rdb",
        "save 3600 1 300 100 60 10000",
        "appendonly yes",
        'appendfilename "appendonly.aof"',
        "appendfsync everysec",
        "databases 16",
    ]
    if settings.redis_password is not None:
        lines.append(f"requirepass {_conf_string(settings.redis_password.get_secret_value())}")
    return "\n".join(lines) + "\n"


def _conf_string(text: str) -> str:
    """`text` as a double-quoted redis.conf argument (backslash and quote escaped).

    Raises:
        ConfigurationError: when it is empty or holds a control character.
    """
    if not text or any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise ConfigurationError("KEYSHIFT_REDIS_PASSWORD must be non-empty and hold no control character")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def server_executable(*, install: bool = True) -> str:
    """Path of `redis-server`, installing Debian's package first when it is missing.

    Args:
        install: whether to run `apt-get update && apt-get install -y redis-server` when the
            server is missing and this process runs as root.

    Raises:
        StackError: when it is missing and cannot be installed here; the message says how.
    """
    found = shutil.which("redis-server") or (
        "/usr/bin/redis-server" if os.access("/usr/bin/redis-server", os.X_OK) else None
    )
    if found:
        return found
    how = f"install it with `sudo apt-get update && sudo apt-get install -y {DEBIAN_PACKAGE}`"
    if not install or os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise StackError(f"redis-server is not on PATH; {how}")
    _apt_install(DEBIAN_PACKAGE)
    found = shutil.which("redis-server") or "/usr/bin/redis-server"
    if not os.access(found, os.X_OK):
        raise StackError(f"apt-get installed {DEBIAN_PACKAGE} but redis-server is not there; {how}")
    return found


def _apt_install(package: str) -> None:
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends", package]):
        log.info("running %s", " ".join(argv))
        result = subprocess.run(argv, capture_output=True, text=True, env=env, check=False, timeout=900)
        if result.returncode != 0:
            output = (result.stdout + result.stderr).strip()[-3000:]
            raise StackError(f"`{' '.join(argv)}` failed (exit {result.returncode}):\n{output}")
    # Debian's package may start its own service on 6379 (where no policy-rc.d forbids it);
    # keyshift supervises its own server, so stop that one again.
    if shutil.which("service"):
        subprocess.run(["service", "redis-server", "stop"], capture_output=True, check=False)


def client(settings: Settings, *, timeout_s: float = 2.0) -> redis_py.Redis:
    """A redis-py client for probes: database 0, the settings' password, socket timeouts of
    `timeout_s` s, no retries."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    password = settings.redis_password
    return redis.Redis(
        host=settings.redis_host,
        port=settings.redis_port,
        db=0,
        password=None if password is None else password.get_secret_value(),
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0),  # a probe answers now or not: the caller does the waiting
    )


def unreachable(settings: Settings, exc: Exception) -> StackError:
    """The error for a redis-py error `exc` of a keyshift client: a refused login names the
    password setting to fix (`auth_fix`), anything else `keyshift stack up`."""
    import redis

    if isinstance(exc, redis.AuthenticationError):
        return StackError(f"Redis at {settings.redis_address} refused the login ({exc}); {auth_fix(settings)}")
    return StackError(f"Redis at {settings.redis_address} is not reachable ({exc}); run `keyshift stack up`")


def check_server(settings: Settings, *, timeout_s: float = 5.0) -> None:
    """Fail fast unless the coordinator answers PING with the settings' password.

    Raises:
        StackError: `unreachable`'s, with the fix.
    """
    import redis

    conn = client(settings, timeout_s=timeout_s)
    try:
        conn.ping()
    except redis.RedisError as exc:
        raise unreachable(settings, exc) from exc
    finally:
        conn.close()


def ping(settings: Settings, *, timeout_s: float = 2.0) -> str:
    """PING the server; return its version.

    Raises:
        StackError: when it does not answer within `timeout_s` seconds, or refuses the password
            (or its absence): the message says which setting to fix.
    """
    import redis

    where = f"Redis on {settings.redis_host}:{settings.redis_port}"
    conn = client(settings, timeout_s=timeout_s)
    try:
        if not conn.ping():
            raise StackError(f"{where} did not answer PING")
        return str(conn.info("server").get("redis_version", "?"))
    except redis.AuthenticationError as exc:
        raise StackError(f"{where} refused the login ({exc}); {auth_fix(settings)}") from exc
    except redis.RedisError as exc:
        raise StackError(f"{where} did not answer: {exc}") from exc
    finally:
        conn.close()


def _answers_without_password(settings: Settings) -> bool:
    """True when the server takes commands from a client that gives no password."""
    try:
        ping(settings.model_copy(update={"redis_password": None}))
        return True
    except StackError:
        return False


def auth_fix(settings: Settings) -> str:
    """What to do when Redis refuses keyshift's login (NOAUTH, WRONGPASS, or AUTH without a password set)."""
    if settings.redis_password is None:
        return "it wants a password: set KEYSHIFT_REDIS_PASSWORD to the one it was started with"
    return "set KEYSHIFT_REDIS_PASSWORD to the server's password (unset it if the server has none)"


def is_healthy(settings: Settings, *, timeout_s: float = 2.0) -> bool:
    """True when the server answers PING within `timeout_s` seconds."""
    try:
        ping(settings, timeout_s=timeout_s)
        return True
    except StackError as exc:
        log.debug("redis not healthy: %s", exc)
        return False


def start(settings: Settings) -> bool:
    """Start the server unless it runs already; do not wait for it (see `wait_healthy`).

    A Redis that keyshift did not start but that answers PING on the port is reused.

    Returns:
        True when a server process was started, False when one was already there.

    Raises:
        StackError: when the port is taken by something that does not answer PING, by a Redis
            that refuses the settings' password or has none while the settings ask for one, when
            keyshift's Redis runs with another configuration than the settings render (restart
            it), or redis-server is missing and cannot be installed.
        ConfigurationError: for a password redis.conf cannot hold.
    """
    home = settings.home
    if process.is_running(home, NAME):
        process.check_config_unchanged(home, NAME, config_file(settings), render_config(settings))
        log.info("redis already running (pid %d)", process.read_record(home, NAME).pid)
        return False
    if process.port_open(settings.redis_host, settings.redis_port):
        owner = process.port_owner(settings.redis_port)
        who = owner.describe() if owner else "owner unknown"
        import redis

        try:
            ping(settings)
        except StackError as exc:
            if isinstance(exc.__cause__, redis.AuthenticationError):
                raise StackError(f"{exc} ({who})") from exc
        else:
            if settings.redis_password is not None and _answers_without_password(settings):
                # Redis's default user takes any password while it has none: not what was asked for
                raise StackError(
                    f"a Redis without a password answers on {settings.redis_address} ({who}), but "
                    "KEYSHIFT_REDIS_PASSWORD asks for one; stop that Redis, or choose another port "
                    "with KEYSHIFT_REDIS_PORT"
                )
            log.info("a Redis already answers on %s (%s); reusing it", settings.redis_address, who)
            return False
        raise StackError(
            f"port {settings.redis_host}:{settings.redis_port} is in use by another process ({who}); "
            "stop it, or choose another port with KEYSHIFT_REDIS_PORT"
        )
    config = render_config(settings)
    server = server_executable()
    redis_dir(settings).mkdir(parents=True, exist_ok=True)
    process.write_private(config_file(settings), config)
    process.start(home, NAME, [server, str(config_file(settings))], cwd=redis_dir(settings))
    return True


def wait_healthy(settings: Settings, *, timeout_s: float) -> float:
    """Wait until the server answers PING; return the seconds waited.

    Raises:
        StackError: after `timeout_s` seconds, or as soon as the server process exits; the
            message names `<home>/logs/redis.log`.
    """
    ours = process.read_record(settings.home, NAME) is not None
    return process.wait_until(
        lambda: is_healthy(settings),
        timeout_s=timeout_s,
        what=f"redis on {settings.redis_host}:{settings.redis_port}",
        log_path=process.log_file(settings.home, NAME),
        alive=(lambda: process.is_running(settings.home, NAME)) if ours else None,
        interval_s=0.2,
    )


def stop(settings: Settings) -> bool:
    """Stop the server if keyshift started it (SIGTERM: Redis flushes the AOF and exits).

    Returns:
        True when a running server was stopped.
    """
    return process.stop(settings.home, NAME, timeout_s=30.0)


def status(settings: Settings) -> ServiceStatus:
    """The server's state, address and process, with its version when it answers."""
    record = process.running_record(settings.home, NAME)
    proc = ProcessState(NAME, record.pid if record else None,
                        str(process.log_file(settings.home, NAME)))
    address = settings.redis_address
    try:
        version = ping(settings)
        detail = f"Redis {version}, append-only file on"
        state = HEALTHY if record else EXTERNAL
        if state == EXTERNAL:
            owner = process.port_owner(settings.redis_port)
            detail = f"Redis {version} ({owner.describe() if owner else 'not started by this keyshift'})"
    except StackError as exc:
        detail = str(exc)
        if record:
            state = UNHEALTHY
        elif process.port_open(settings.redis_host, settings.redis_port):
            state = BLOCKED
        else:
            state, detail = STOPPED, ""
    return ServiceStatus(NAME, state, address, (proc,), detail)
