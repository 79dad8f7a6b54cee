"""`keyshift package`: build what a Spark cluster's executors run (`keyshift.stack.executor_env`)."""

from __future__ import annotations

import click

from keyshift.settings import Settings


@click.command(name="package")
@click.option("--python", "python", default=None, metavar="PATH",
              help="The interpreter the workers have, when not at this venv's base interpreter's path "
                   "(venv-pack's python prefix). Default: the base interpreter's path.")
def command(python: str | None) -> None:
    """Pack the executors' Python environment and keyshift's code (spark.archives).

    Each is rebuilt only when its inputs changed: the environment when requirements.lock or the
    `executor` dependencies in pyproject.toml do, the code when a source file does. Prints the
    Spark settings that ship them; jobs on a cluster master (`KEYSHIFT_SPARK_MASTER=spark://...`)
    add them by themselves.
    """
    from keyshift.stack.executor_env import build

    package = build(Settings(), python)
    click.echo(f"environment  {package.environment} ({package.environment.stat().st_size / 1e6:.0f} MB)")
    click.echo(f"code         {package.code} ({package.code.stat().st_size / 1e3:.0f} kB)")
    for key, value in package.spark_conf().items():
        click.echo(f"  --conf {key}={value}")
