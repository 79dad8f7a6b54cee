"""The local Redis's configuration and health probe, without starting it."""

from __future__ import annotations

import pytest

from keyshift.errors import StackError
from keyshift.settings import Settings
from keyshift.stack import redis


def _directives(text: str) -> dict[str, str]:
    pairs = (line.split(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return {key: value for key, value in pairs}


@pytest.fixture
def settings(tmp_path) -> Settings:
    return Settings(home=tmp_path / "state", redis_port=16379)


def test_config_loopback_foreground_append_only(settings):
    conf = _directives(redis.render_config(settings))

    assert conf["bind"] == "127.0.0.1"
    assert conf["port"] == "16379"
    assert conf["protected-mode"] == "yes"
    assert conf["daemonize"] == "no"  # keyshift supervises it through its pid file
    assert conf["appendonly"] == "yes"
    assert conf["appendfsync"] == "everysec"
    assert conf["dir"] == f'"{settings.home / "redis"}"'
    assert conf["logfile"] == '""'  # stdout, into logs/redis.log


def test_config_file_lives_under_home(settings):
    assert redis.config_file(settings) == settings.home / "redis" / "redis.conf"


def test_ping_of_a_closed_port_is_a_stack_error(settings):
    closed = Settings(home=settings.home, redis_port=1)
    with pytest.raises(StackError, match="did not answer"):
        redis.ping(closed, timeout_s=0.5)
    assert redis.is_healthy(closed, timeout_s=0.5) is False


def test_missing_server_without_root_says_how_to_install(monkeypatch):
    monkeypatch.setattr(redis.shutil, "which", lambda name: None)
    monkeypatch.setattr(redis.os, "access", lambda path, mode: False)
    monkeypatch.setattr(redis.os, "geteuid", lambda: 1000)
    with pytest.raises(StackError, match="apt-get install -y redis-server"):
        redis.server_executable()


def test_missing_server_as_root_installs_debians_package(monkeypatch):
    installed = []
    monkeypatch.setattr(redis.shutil, "which", lambda name: "/usr/bin/apt-get" if name == "apt-get" else None)
    monkeypatch.setattr(redis.os, "access", lambda path, mode: bool(installed))
    monkeypatch.setattr(redis.os, "geteuid", lambda: 0)
    monkeypatch.setattr(redis, "_apt_install", installed.append)

    assert redis.server_executable() == "/usr/bin/redis-server"
    assert installed == ["redis-server"]


def test_no_password_by_default(settings):
    assert "requirepass" not in _directives(redis.render_config(settings))
    assert settings.redis_url == "redis://127.0.0.1:16379/0"


def test_a_password_goes_to_requirepass_and_into_the_url_quoted(settings):
    secured = Settings(home=settings.home, redis_port=16379, redis_password='p "w"@/x')
    conf = _directives(redis.render_config(secured))

    assert conf["requirepass"] == '"p \\"w\\"@/x"'  # redis.conf's quoting
    assert secured.redis_url == "redis://:p%20%22w%22%40%2Fx@127.0.0.1:16379/0"
    assert "p " not in secured.redis_address and "p " not in repr(secured)


def test_a_password_with_a_control_character_is_refused(settings):
    from keyshift.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="KEYSHIFT_REDIS_PASSWORD"):
        redis.render_config(Settings(home=settings.home, redis_password="a\nb"))
