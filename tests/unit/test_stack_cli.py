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
    ],
)
def test_select(only, expected):
    assert stack.select(only) == expected


def test_select_rejects_unknown_services():
    with pytest.raises(ConfigurationError, match="zookeeper"):
        stack.select("kafka,zookeeper")


@pytest.mark.parametrize(
    ("args", "shown"),
    [
        (["--help"], ["up", "down", "status", "fetch"]),
        (["up", "--help"], ["--only", "--timeout", "default: 300", "default: (all)"]),
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
