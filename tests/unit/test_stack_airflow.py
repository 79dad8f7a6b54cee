"""The local Airflow's environment, secrets, login and API session, without starting it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import requests

from keyshift.errors import StackError
from keyshift.settings import PROJECT_ROOT, Settings
from keyshift.stack import airflow

SECRETS = {"jwt_secret": "j" * 86, "api_secret_key": "s" * 86, "fernet_key": "f" * 44}


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings(home=tmp_path / "state", airflow_port=18080)


@pytest.fixture
def env(settings) -> dict[str, str]:
    return airflow.airflow_env(settings, secrets_=SECRETS, base={"PATH": "/usr/bin:/bin", "HOME": "/root"})


def test_environment_points_airflow_at_the_repository_and_the_state_dir(settings, env):
    assert env["AIRFLOW_HOME"] == str(settings.home / "airflow")
    assert env["AIRFLOW__CORE__DAGS_FOLDER"] == str(PROJECT_ROOT / "dags")
    assert env["AIRFLOW__CORE__PLUGINS_FOLDER"] == str(PROJECT_ROOT / "plugins")
    assert env["AIRFLOW__CORE__LOAD_EXAMPLES"] == "False"
    assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == f"sqlite:///{settings.home / 'airflow' / 'airflow.db'}"
    assert env["HOME"] == "/root"  # the base environment is kept


def test_api_server_is_on_loopback_and_tasks_reach_its_execution_api(env):
    assert env["AIRFLOW__API__HOST"] == "127.0.0.1"
    assert env["AIRFLOW__API__PORT"] == "18080"
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] == "http://127.0.0.1:18080/execution/"
    assert airflow.components(Settings(airflow_port=18080))["airflow-api-server"][-4:] == [
        "--host", "127.0.0.1", "--port", "18080",
    ]


def test_login_is_the_settings_admin_through_the_simple_auth_manager(settings, env):
    assert env["AIRFLOW__CORE__AUTH_MANAGER"].endswith("SimpleAuthManager")
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] == "admin:admin"
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"] == str(airflow.passwords_file(settings))

    path = airflow.write_passwords(Settings(home=settings.home, airflow_user="ops", airflow_password="s3cret"))
    assert json.loads(path.read_text()) == {"ops": "s3cret"}
    assert path.stat().st_mode & 0o077 == 0  # not readable by others


def test_every_component_shares_one_set_of_secrets(env):
    assert env["AIRFLOW__API_AUTH__JWT_SECRET"] == SECRETS["jwt_secret"]
    assert env["AIRFLOW__API__SECRET_KEY"] == SECRETS["api_secret_key"]
    assert env["AIRFLOW__CORE__FERNET_KEY"] == SECRETS["fernet_key"]


def test_secrets_are_generated_once_and_kept(settings):
    first = airflow.load_secrets(settings)
    second = airflow.load_secrets(settings)

    assert first == second
    assert len(first["jwt_secret"]) >= 64  # HS512 wants a key of 64 bytes or more
    from cryptography.fernet import Fernet

    Fernet(first["fernet_key"].encode())  # a valid Fernet key
    assert airflow.secrets_file(settings).stat().st_mode & 0o077 == 0


def test_tasks_find_spark_submit_and_this_python(env):
    bin_dir = str(Path(sys.executable).parent)
    assert env["PATH"].split(os.pathsep)[0] == bin_dir
    assert (Path(bin_dir) / "spark-submit").exists()
    assert env["PYSPARK_PYTHON"] == sys.executable
    assert env["PYSPARK_DRIVER_PYTHON"] == sys.executable


def test_tasks_rebuild_the_same_settings(settings, env, monkeypatch):
    for key in [k for k in os.environ if k.startswith("KEYSHIFT_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        if key.startswith("KEYSHIFT_"):
            monkeypatch.setenv(key, value)

    assert Settings() == settings


@pytest.mark.parametrize(
    ("spark_master", "expected"),
    [
        ("local[*]", "local[*]"),  # the default: spark-submit --master local[*]
        ("local[2]", "local[2]"),
        ("spark://spark-master:7077", "spark://spark-master:7077"),  # the compose stack's master
    ],
)
def test_spark_default_connection_gives_the_provider_our_master(spark_master, expected, monkeypatch):
    """The Spark provider's own hook resolves the connection from the environment variable."""
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

    conn = airflow.spark_connection(Settings(spark_master=spark_master))
    monkeypatch.setenv("AIRFLOW_CONN_SPARK_DEFAULT", conn)

    resolved = SparkSubmitHook(conn_id="spark_default")._resolve_connection()

    assert resolved["master"] == expected
    assert resolved["spark_binary"] == "spark-submit"


@pytest.mark.parametrize(
    ("answer", "bad"),
    [
        ({c: {"status": "healthy"} for c in airflow.HEALTH_COMPONENTS}, []),  # all healthy
        ({"metadatabase": {"status": "healthy"}, "scheduler": {"status": "unhealthy"},
          "triggerer": {"status": "healthy"}, "dag_processor": {"status": "healthy"}}, ["scheduler"]),
        ({"metadatabase": {"status": "healthy"}, "scheduler": {"status": "healthy"},
          "triggerer": {"status": None}, "dag_processor": {"status": "healthy"}}, ["triggerer"]),  # never ran
        ({}, list(airflow.HEALTH_COMPONENTS)),  # an empty answer
    ],
)
def test_unhealthy_components(answer, bad):
    assert airflow.unhealthy_components(answer) == bad


class _Recorder(requests.adapters.BaseAdapter):
    def __init__(self):
        super().__init__()
        self.urls = []

    def send(self, request, **kwargs):
        self.urls.append((request.url, request.headers.get("Authorization")))
        response = requests.Response()
        response.status_code = 200
        response._content = b"{}"
        response.request = request
        return response

    def close(self):
        pass


def test_session_sends_relative_urls_to_the_api_server():
    session = airflow.AirflowSession("http://127.0.0.1:18080/")
    session.headers["Authorization"] = "Bearer t"
    recorder = _Recorder()
    session.mount("http://", recorder)

    session.get("/api/v2/dags")
    session.get("http://elsewhere:1/x")

    assert recorder.urls == [
        ("http://127.0.0.1:18080/api/v2/dags", "Bearer t"),
        ("http://elsewhere:1/x", "Bearer t"),
    ]


def test_token_without_a_server_is_a_stack_error():
    with pytest.raises(StackError, match="did not answer"):
        airflow.token(Settings(airflow_port=1, airflow_password="pw"), timeout_s=1)


def test_token_without_any_password_says_how_to_get_one(settings):
    with pytest.raises(StackError, match="run `keyshift stack up`.*KEYSHIFT_AIRFLOW_PASSWORD"):
        airflow.token(settings, timeout_s=1)


def test_the_admin_password_is_generated_once_kept_private_and_read_back(settings):
    assert settings.airflow_password is None  # no password in the code or the defaults
    path = airflow.write_passwords(settings)  # what the first `stack up` does
    generated = airflow.admin_password(settings)

    assert json.loads(path.read_text()) == {"admin": generated}
    assert path.stat().st_mode & 0o777 == 0o600
    assert len(generated) >= 24 and generated != "admin"
    airflow.write_passwords(settings)  # a later first start keeps it
    assert airflow.admin_password(settings) == generated
    assert airflow.login_hint(settings) == f"http://127.0.0.1:18080 (user admin, password {generated})"
    # another state directory gets another password
    other = Settings(home=settings.home.parent / "other", airflow_port=18080)
    assert airflow.admin_password(other, create=True) != generated


def test_keyshift_airflow_password_overrides_the_generated_one(settings, monkeypatch):
    airflow.write_passwords(settings)
    monkeypatch.setenv("KEYSHIFT_AIRFLOW_PASSWORD", "from-env")
    overridden = Settings(home=settings.home, airflow_port=18080)

    assert airflow.admin_password(overridden) == "from-env"
    airflow.write_passwords(overridden)
    assert json.loads(airflow.passwords_file(settings).read_text()) == {"admin": "from-env"}
    assert "from-env" not in repr(overridden)  # a SecretStr: not in reprs and logs


def test_tasks_bind_local_spark_drivers_to_loopback(settings, env):
    assert env["SPARK_LOCAL_IP"] == "127.0.0.1"
    cluster = Settings(home=settings.home, spark_master="spark://master:7077")
    assert "SPARK_LOCAL_IP" not in airflow.airflow_env(cluster, secrets_=SECRETS, base={"PATH": "/bin"})


def test_login_hint_names_address_user_and_password():
    hint = airflow.login_hint(Settings(airflow_port=18080, airflow_password="pw"))
    assert hint == "http://127.0.0.1:18080 (user admin, password pw)"
