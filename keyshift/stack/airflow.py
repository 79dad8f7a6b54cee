"""Apache Airflow 3 on loopback: api-server, scheduler, dag-processor and triggerer, SQLite, LocalExecutor.

What `airflow standalone` does, as four processes keyshift supervises one by one (each with its own
pid file and log, `logs/airflow-<component>.log`), so `keyshift stack status` can say which one is
down. `AIRFLOW_HOME` is `<home>/airflow`; the DAGs are the repository's `dags/`, the plugins its
`plugins/`; no examples. Every component gets the same environment (`airflow_env`):

* the simple auth manager with one admin user, `airflow_user` (admin by default), whose password is
  generated (`secrets.token_urlsafe`) at the first start into the auth manager's passwords file in
  the state directory (mode 0600), printed by `keyshift stack status`, and read back by every
  client (`admin_password`); `KEYSHIFT_AIRFLOW_PASSWORD` overrides it;
* one JWT secret, API secret key and Fernet key, generated once into
  `<home>/airflow/keyshift-secrets.json`, so tokens minted by one process verify in another;
* the connection `spark_default` as `AIRFLOW_CONN_SPARK_DEFAULT` (conn_type spark, host =
  `spark_master`, e.g. `local[*]`; the Spark provider then passes `--master local[*]`);
* `SPARK_LOCAL_IP=127.0.0.1` for a local `spark_master`, so the Spark drivers tasks start (and
  their UIs) listen on loopback only (`keyshift.stack.spark.loopback_env`);
* PATH starting with this environment's `bin/` (the Spark provider runs `spark-submit` from PATH),
  PYSPARK_PYTHON and PYSPARK_DRIVER_PYTHON = this interpreter, and the `KEYSHIFT_*` variables of
  the settings, so tasks see the same stack as the command that started it.

Health is `GET /api/v2/monitor/health` reporting the metadatabase, scheduler, triggerer and
dag-processor healthy. `api_session` gives a `requests.Session` with a JWT from `POST /auth/token`.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import requests

from keyshift.errors import StackError
from keyshift.settings import PROJECT_ROOT, Settings
from keyshift.stack import process, spark
from keyshift.stack.service import (
    BLOCKED,
    EXTERNAL,
    HEALTHY,
    STOPPED,
    UNHEALTHY,
    ProcessState,
    ServiceStatus,
)

log = logging.getLogger("keyshift.stack.airflow")

NAME = "airflow"
HOST = "127.0.0.1"
"""The API server and UI listen on loopback only."""
DAGS_FOLDER = PROJECT_ROOT / "dags"
PLUGINS_FOLDER = PROJECT_ROOT / "plugins"
SIMPLE_AUTH_MANAGER = "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager"
PARALLELISM = 8
"""Task slots of the LocalExecutor (Airflow's default, 32, forks 32 workers on a 2-core machine)."""
DAG_LIST_INTERVAL_S = 30
"""How often the dag-processor looks for new DAG files (Airflow's default is 300 s)."""
HEALTH_COMPONENTS = ("metadatabase", "scheduler", "triggerer", "dag_processor")
"""The parts `/api/v2/monitor/health` must report healthy."""


def components(settings: Settings) -> dict[str, list[str]]:
    """The supervised processes: process name -> arguments of the `airflow` command.

    The scheduler and triggerer skip their log servers: everything runs on this host, and the API
    server reads task logs from `<home>/airflow/logs` directly.
    """
    return {
        "airflow-scheduler": ["scheduler", "--skip-serve-logs"],
        "airflow-dag-processor": ["dag-processor"],
        "airflow-triggerer": ["triggerer", "--skip-serve-logs"],
        "airflow-api-server": ["api-server", "--host", HOST, "--port", str(settings.airflow_port)],
    }


def airflow_home(settings: Settings) -> Path:
    """`AIRFLOW_HOME`: `<home>/airflow` (airflow.cfg, airflow.db, logs/)."""
    return settings.home / "airflow"


def base_url(settings: Settings) -> str:
    """The API server's and UI's address, `http://127.0.0.1:<airflow_port>`."""
    return f"http://{HOST}:{settings.airflow_port}"


def passwords_file(settings: Settings) -> Path:
    """The simple auth manager's passwords file keyshift writes (JSON user -> password)."""
    return airflow_home(settings) / "simple_auth_manager_passwords.json"


def secrets_file(settings: Settings) -> Path:
    """Where the JWT secret, API secret key and Fernet key are kept: `keyshift-secrets.json`."""
    return airflow_home(settings) / "keyshift-secrets.json"


def airflow_executable() -> str:
    """The `airflow` command of this Python environment (beside this interpreter), else on PATH.

    Raises:
        StackError: when Airflow is not installed.
    """
    beside = Path(sys.executable).parent / "airflow"
    if beside.is_file():
        return str(beside)
    found = shutil.which("airflow")
    if found is None:
        raise StackError("the `airflow` command is missing; install the environment with `make env`")
    return found


def load_secrets(settings: Settings) -> dict[str, str]:
    """The stack's Airflow secrets, generated once and then reused (file mode 0600).

    Returns:
        `jwt_secret`, `api_secret_key` and `fernet_key`.
    """
    path = secrets_file(settings)
    try:
        data = json.loads(path.read_text())
        if {"jwt_secret", "api_secret_key", "fernet_key"} <= data.keys():
            return data
    except (FileNotFoundError, ValueError):
        pass
    from cryptography.fernet import Fernet

    data = {
        "jwt_secret": secrets.token_urlsafe(64),  # >= 64 bytes: HS512-grade
        "api_secret_key": secrets.token_urlsafe(64),
        "fernet_key": Fernet.generate_key().decode("ascii"),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return data


def settings_env(settings: Settings) -> dict[str, str]:
    """The settings as `KEYSHIFT_*` environment variables, so child processes rebuild the same ones."""
    env = {}
    for field, value in settings.model_dump(mode="json").items():
        if value is not None:
            text = value if isinstance(value, str) else json.dumps(value)
            env[f"KEYSHIFT_{field.upper()}"] = text
    return env


def spark_connection(settings: Settings) -> str:
    """The `spark_default` connection as Airflow's JSON connection format.

    The Spark provider turns conn_type `spark` with host `local[*]` (and no port) into
    `--master local[*]`; a host such as `spark://master:7077` is passed through as the master URL.
    """
    return json.dumps({"conn_type": "spark", "host": settings.spark_master})


def airflow_env(
    settings: Settings,
    *,
    secrets_: dict[str, str] | None = None,
    base: dict[str, str] | None = None,
) -> dict[str, str]:
    """The complete environment of every Airflow component of the local stack.

    Also what to use to run other `airflow` commands against the same home (e.g.
    `subprocess.run(["airflow", "dags", "list"], env=airflow_env(settings))`).

    Args:
        settings: the stack's settings.
        secrets_: the JWT secret, API secret key and Fernet key (default: `load_secrets`).
        base: the environment to extend (default: this process's).

    Returns:
        `base` plus the `AIRFLOW_*`, `KEYSHIFT_*`, PATH and PYSPARK_* variables the module
        docstring lists.
    """
    secret = secrets_ if secrets_ is not None else load_secrets(settings)
    home = airflow_home(settings)
    env = dict(os.environ if base is None else base)
    bin_dir = str(Path(sys.executable).parent)
    path = env.get("PATH", "")
    if bin_dir not in path.split(os.pathsep):
        path = os.pathsep.join(p for p in (bin_dir, path) if p)
    env.update(settings_env(settings))
    spark.bind_loopback(settings, env)  # tasks' local Spark drivers and UIs on loopback only
    env.update(
        {
            "PATH": path,
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_FOLDER),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(PLUGINS_FOLDER),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": str(PARALLELISM),
            "AIRFLOW__CORE__FERNET_KEY": secret["fernet_key"],
            "AIRFLOW__CORE__AUTH_MANAGER": SIMPLE_AUTH_MANAGER,
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{settings.airflow_user}:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords_file(settings)),
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{base_url(settings)}/execution/",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
            "AIRFLOW__API__HOST": HOST,
            "AIRFLOW__API__PORT": str(settings.airflow_port),
            "AIRFLOW__API__WORKERS": "1",
            "AIRFLOW__API__SECRET_KEY": secret["api_secret_key"],
            "AIRFLOW__API_AUTH__JWT_SECRET": secret["jwt_secret"],
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": str(DAG_LIST_INTERVAL_S),
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home / "logs"),
            "AIRFLOW_CONN_SPARK_DEFAULT": spark_connection(settings),
        }
    )
    return env


PASSWORD_BYTES = 18
"""Random bytes of a generated admin password (`secrets.token_urlsafe`: 24 characters)."""


def _stored_password(settings: Settings) -> str | None:
    """The password of `airflow_user` in the passwords file, or None when it has none."""
    try:
        stored = json.loads(passwords_file(settings).read_text())
    except (FileNotFoundError, ValueError):
        return None
    value = stored.get(settings.airflow_user) if isinstance(stored, dict) else None
    return value if isinstance(value, str) and value else None


def admin_password(settings: Settings, *, create: bool = False) -> str:
    """The password of the local Airflow's admin (`settings.airflow_user`).

    `KEYSHIFT_AIRFLOW_PASSWORD` when set; else the one kept in the auth manager's passwords file
    in the state directory (`passwords_file`); else, with `create`, a new random one
    (`secrets.token_urlsafe`), which is written there (mode 0600) before it is returned.
    `keyshift stack up` creates it at Airflow's first start; everything else only reads it.

    Raises:
        StackError: when there is none yet and `create` is False (run `keyshift stack up`, or set
            KEYSHIFT_AIRFLOW_PASSWORD).
    """
    if settings.airflow_password is not None:
        return settings.airflow_password.get_secret_value()
    stored = _stored_password(settings)
    if stored is not None:
        return stored
    if not create:
        raise StackError(
            f"no Airflow password for user {settings.airflow_user!r} in {passwords_file(settings)}; "
            "run `keyshift stack up` (it generates one), or set KEYSHIFT_AIRFLOW_PASSWORD"
        )
    password = secrets.token_urlsafe(PASSWORD_BYTES)
    _write_passwords(settings, password)
    log.info("generated the Airflow password of %r into %s", settings.airflow_user, passwords_file(settings))
    return password


def _write_passwords(settings: Settings, password: str) -> Path:
    return process.write_private(passwords_file(settings), json.dumps({settings.airflow_user: password}) + "\n")


def write_passwords(settings: Settings) -> Path:
    """Write the simple auth manager's passwords file: `{airflow_user: admin_password}` (mode 0600).

    The password is `KEYSHIFT_AIRFLOW_PASSWORD` when set, else the one the file already holds for
    the user, else a newly generated one (see `admin_password`). Written at every first start of
    Airflow, so a changed `KEYSHIFT_AIRFLOW_PASSWORD` takes effect on the next `keyshift stack up`
    after a `down`. Returns the file's path.
    """
    return _write_passwords(settings, admin_password(settings, create=True))


def migrate_db(settings: Settings, env: dict[str, str], *, timeout_s: float = 600.0) -> None:
    """Create or upgrade the metadata database (`airflow db migrate`); a no-op when current.

    Its output goes to `<home>/logs/airflow-db-migrate.log`.

    Raises:
        StackError: when the migration fails or takes longer than `timeout_s` seconds.
    """
    log_path = process.log_file(settings.home, "airflow-db-migrate")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log.info("migrating the Airflow metadata database (%s)", env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    with log_path.open("ab") as out:
        try:
            result = subprocess.run(
                [airflow_executable(), "db", "migrate"],
                env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                timeout=timeout_s, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired as exc:
            raise StackError(
                f"`airflow db migrate` took longer than {timeout_s:.0f} s; see its log {log_path}"
            ) from exc
    if result.returncode != 0:
        raise StackError(
            f"`airflow db migrate` failed (exit {result.returncode}); see its log {log_path}:\n"
            + process.tail(log_path, 15)
        )


def health(settings: Settings, *, timeout_s: float = 5.0) -> dict[str, Any]:
    """`GET /api/v2/monitor/health`: the status of each Airflow component.

    Returns:
        The JSON answer, e.g. `{"metadatabase": {"status": "healthy"}, "scheduler": {...}, ...}`.

    Raises:
        StackError: when the API server does not answer or answers with an error.
    """
    url = f"{base_url(settings)}/api/v2/monitor/health"
    try:
        response = requests.get(url, timeout=timeout_s)
        response.raise_for_status()
        return response.json()
    except (requests.RequestException, ValueError) as exc:
        raise StackError(f"Airflow at {url} did not answer: {exc}") from exc


def unhealthy_components(answer: dict[str, Any]) -> list[str]:
    """The components a health answer does not report healthy (`[]` when all are)."""
    return [
        name for name in HEALTH_COMPONENTS
        if (answer.get(name) or {}).get("status") != "healthy"
    ]  # fmt: skip


def is_healthy(settings: Settings, *, timeout_s: float = 5.0) -> bool:
    """True when the health endpoint answers and reports every component healthy."""
    try:
        bad = unhealthy_components(health(settings, timeout_s=timeout_s))
    except StackError as exc:
        log.debug("airflow not healthy: %s", exc)
        return False
    if bad:
        log.debug("airflow components not healthy yet: %s", ", ".join(bad))
    return not bad


def _running(settings: Settings) -> dict[str, bool]:
    return {name: process.is_running(settings.home, name) for name in components(settings)}


def start(settings: Settings, *, migrate_timeout_s: float = 600.0) -> bool:
    """Start whichever Airflow components are not running; do not wait (see `wait_healthy`).

    On a first start (none running) it writes the passwords file and migrates the database first.
    An Airflow that answers on the port is reused, unless another keyshift state directory started
    it: that one serves another checkout's DAGs and settings.

    Returns:
        True when at least one component was started.

    Raises:
        StackError: when the port is taken by something that is not a healthy Airflow, or by
            another keyshift stack's Airflow, or the database migration fails.
    """
    home = settings.home
    running = _running(settings)
    if all(running.values()):
        log.info("airflow already running (%s)", ", ".join(running))
        return False
    if not running["airflow-api-server"] and process.port_open(HOST, settings.airflow_port):
        owner = process.port_owner(settings.airflow_port)
        who = owner.describe() if owner else "owner unknown"
        foreign = owner is not None and owner.keyshift_home not in (None, settings.home)
        if foreign:
            # another checkout's Airflow: its DAGs, code and KEYSHIFT_* settings are not these
            raise StackError(
                f"Airflow on {base_url(settings)} belongs to another keyshift stack ({who}); it "
                "runs that stack's DAGs and settings, not this checkout's. Stop it with "
                f"`KEYSHIFT_HOME={owner.keyshift_home} keyshift stack down --only airflow`, or run "
                "this one on another port with KEYSHIFT_AIRFLOW_PORT"
            )
        if is_healthy(settings):
            log.info("an Airflow already answers on %s (%s); reusing it", base_url(settings), who)
            return False
        raise StackError(
            f"port {HOST}:{settings.airflow_port} is in use by another process ({who}); stop it, "
            "or choose another port with KEYSHIFT_AIRFLOW_PORT"
        )
    env = airflow_env(settings)
    airflow_home(settings).mkdir(parents=True, exist_ok=True)
    if not any(running.values()):
        write_passwords(settings)
        migrate_db(settings, env, timeout_s=migrate_timeout_s)
    airflow = airflow_executable()
    for name, args in components(settings).items():
        if not running[name]:
            process.start(home, name, [airflow, *args], env=env, cwd=airflow_home(settings))
    return True


def wait_healthy(settings: Settings, *, timeout_s: float) -> float:
    """Wait until every component runs and the health endpoint reports all healthy.

    Returns:
        The seconds waited.

    Raises:
        StackError: after `timeout_s` seconds, or as soon as one of keyshift's Airflow processes
            exits; the message names that component's log file.
    """
    names = list(components(settings))
    ours = [n for n in names if process.read_record(settings.home, n) is not None]
    dead: list[str] = []

    def alive() -> bool:
        dead[:] = [n for n in ours if not process.is_running(settings.home, n)]
        return not dead

    try:
        return process.wait_until(
            lambda: is_healthy(settings),
            timeout_s=timeout_s,
            what=f"airflow at {base_url(settings)}",
            log_path=process.log_file(settings.home, "airflow-api-server"),
            alive=alive if ours else None,
            interval_s=2.0,
        )
    except StackError as exc:
        if dead:
            log_path = process.log_file(settings.home, dead[0])
            raise StackError(
                f"{dead[0]} exited before Airflow became healthy; see its log {log_path}:\n"
                + process.tail(log_path, 20)
            ) from exc
        detail = ""
        try:
            bad = unhealthy_components(health(settings))
            detail = f" (not healthy: {', '.join(bad)}; see logs/airflow-<component>.log)"
        except StackError:
            pass
        raise StackError(f"{exc}{detail}") from None


def stop(settings: Settings) -> bool:
    """Stop the Airflow components keyshift started: scheduler first, API server last.

    Returns:
        True when at least one running component was stopped.
    """
    stopped = False
    for name in components(settings):
        stopped = process.stop(settings.home, name, timeout_s=45.0) or stopped
    return stopped


def _login(settings: Settings) -> str:
    """`user admin, password <password>`, or where the password will come from when there is none."""
    try:
        password = admin_password(settings)
    except StackError:
        password = f"not generated yet (`keyshift stack up` writes it to {passwords_file(settings)})"
    return f"user {settings.airflow_user}, password {password}"


def login_hint(settings: Settings) -> str:
    """How to log in: `http://127.0.0.1:8080 (user admin, password <admin_password>)`."""
    return f"{base_url(settings)} ({_login(settings)})"


def status(settings: Settings) -> ServiceStatus:
    """Airflow's state and the pid of each component, with the login when it answers."""
    procs = []
    for name in components(settings):
        record = process.running_record(settings.home, name)
        procs.append(ProcessState(name, record.pid if record else None,
                                  str(process.log_file(settings.home, name))))
    ours = any(p.pid for p in procs)
    try:
        bad = unhealthy_components(health(settings, timeout_s=3.0))
        if bad:
            state, detail = (UNHEALTHY if ours else EXTERNAL), f"not healthy: {', '.join(bad)}"
        else:
            all_ours = all(p.pid for p in procs)
            state = HEALTHY if all_ours else (UNHEALTHY if ours else EXTERNAL)
            detail = f"login: {_login(settings)}"
            if state == EXTERNAL:
                owner = process.port_owner(settings.airflow_port)
                detail += f" ({owner.describe() if owner else 'not started by this keyshift'})"
    except StackError as exc:
        if ours:
            state, detail = UNHEALTHY, str(exc)
        elif process.port_open(HOST, settings.airflow_port):
            state, detail = BLOCKED, str(exc)
        else:
            state, detail = STOPPED, ""
    return ServiceStatus(NAME, state, base_url(settings), tuple(procs), detail)


class AirflowSession(requests.Session):
    """A `requests.Session` whose relative URLs (`/api/v2/dags`) go to the local API server.

    Attributes:
        base_url: `http://127.0.0.1:<airflow_port>`.
    """

    def __init__(self, base: str) -> None:
        super().__init__()
        self.base_url = base.rstrip("/")

    def request(self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any):  # type: ignore[override]
        """Send a request; a URL starting with '/' is taken relative to `base_url`."""
        if isinstance(url, str) and url.startswith("/"):
            url = self.base_url + url
        return super().request(method, url, *args, **kwargs)


def token(settings: Settings, *, timeout_s: float = 10.0) -> str:
    """A JWT access token for the REST API, from `POST /auth/token` with the admin's login.

    The password is `admin_password(settings)`: KEYSHIFT_AIRFLOW_PASSWORD, else the generated
    one in the state directory.

    Raises:
        StackError: when there is no password yet, Airflow does not answer, or it refuses the
            user name and password.
    """
    url = f"{base_url(settings)}/auth/token"
    body = {"username": settings.airflow_user, "password": admin_password(settings)}
    try:
        response = requests.post(url, json=body, timeout=timeout_s)
    except requests.RequestException as exc:
        raise StackError(f"Airflow at {url} did not answer: {exc}; is `keyshift stack up` done?") from exc
    if response.status_code in (401, 403):
        raise StackError(
            f"Airflow refused user {settings.airflow_user!r} ({response.status_code}); the password "
            f"is in {passwords_file(settings)} (set KEYSHIFT_AIRFLOW_PASSWORD to match)"
        )
    if not response.ok:
        raise StackError(f"POST {url} answered {response.status_code}: {response.text[:300]}")
    return response.json()["access_token"]


def api_session(settings: Settings) -> AirflowSession:
    """A session for Airflow's REST API, authenticated with a bearer token (valid 24 h).

    Example:
        `api_session(settings).post("/api/v2/dags/my_dag/dagRuns", json={"logical_date": None})`

    Raises:
        StackError: as `token` does.
    """
    session = AirflowSession(base_url(settings))
    session.headers["Authorization"] = f"Bearer {token(settings)}"
    session.headers["Accept"] = "application/json"
    return session
