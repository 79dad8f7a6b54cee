"""What a cluster's executors run: a packed Python environment and keyshift's code (`keyshift package`).

On `local[*]` the Python workers run this process's interpreter and venv. A cluster's workers
have a bare interpreter, so keyshift ships what its executor-side code imports the way pyspark
documents it ("Python Package Management"):

- the dependencies, a virtual environment packed with venv-pack into `spark.archives`
  (`<archive>#environment`), unpacked by each executor into its working folder, its
  interpreter named by `spark.pyspark.python = ./environment/bin/python`. The packages are
  `[project.optional-dependencies] executor` in `pyproject.toml` at the versions of
  `requirements.lock` (pip's constraints); the archive is rebuilt when either file changes.
- keyshift itself, a zip of the `keyshift` package and `infra/stack.env` (its settings' defaults,
  read at import) in `spark.archives` too (`<zip>#keyshift_code`), on the executors' `PYTHONPATH`
  (`spark.executorEnv.PYTHONPATH`); rebuilt when a source file changes (seconds), so code edits
  do not repack the dependencies. (Not `spark.submit.pyFiles`: a zip on the path cannot be read
  as a folder, and keyshift reads `infra/stack.env` beside its package.)

venv-pack keeps the environment's link to its base interpreter: a worker needs Python 3.11 at
the same path, or the path given as `python_prefix` (venv-pack's "python prefix" rewrite).
Everything lives in `<cache>/executor-env/`.
"""

from __future__ import annotations

import hashlib
import logging
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

from keyshift.errors import StackError
from keyshift.settings import PROJECT_ROOT, Settings

log = logging.getLogger("keyshift.stack.executor_env")

LOCK_FILE = PROJECT_ROOT / "requirements.lock"
PYPROJECT = PROJECT_ROOT / "pyproject.toml"
PACKAGE_DIR = PROJECT_ROOT / "keyshift"
ENVIRONMENT_ALIAS = "environment"
"""The folder each executor unpacks the environment archive into (`<archive>#environment`)."""
CODE_ALIAS = "keyshift_code"
"""The folder each executor unpacks keyshift's code into (`<zip>#keyshift_code`)."""
EXECUTOR_PYTHON = f"./{ENVIRONMENT_ALIAS}/bin/python"
"""The executors' interpreter, relative to their working folder (`spark.pyspark.python`)."""


def driver_folder(parent: Path | None = None) -> Path:
    """A working folder for a driver JVM whose `spark.pyspark.python` is `EXECUTOR_PYTHON`.

    Executors find `./environment/bin/python` in their work folder, where Spark unpacked
    `spark.archives`. But Spark runs Python on the driver too, with the same interpreter setting
    (transformWithState initialises its processor in a Python process of the driver while it
    plans a query: "Cannot run program ./environment/bin/python" otherwise), and there the path
    is relative to the JVM's working directory. In this folder `environment` links to this
    interpreter's environment (`sys.prefix`), so the same relative path names this venv's Python
    on the driver and the shipped one on the executors. Used by a driver JVM keyshift starts
    itself (`keyshift.runtime.session`), by the supervisor's spark-submit and by the pipeline's
    SparkSubmitOperator (`keyshift.orchestration.spark_submit`); every path keyshift hands the
    driver is absolute, so its working directory changes nothing else.

    Args:
        parent: where to make the folder (`<parent>/driver`, reused when its link is right);
            None: a new temporary folder.

    Returns:
        The folder's absolute path.
    """
    if parent is None:
        folder = Path(tempfile.mkdtemp(prefix="keyshift-driver-"))
    else:
        folder = (parent / "driver").absolute()
        folder.mkdir(parents=True, exist_ok=True)
    link = folder / ENVIRONMENT_ALIAS
    if link.is_symlink() and link.resolve() != Path(sys.prefix).resolve():
        link.unlink()
    if not link.is_symlink():
        link.symlink_to(Path(sys.prefix), target_is_directory=True)
    return folder


@dataclass(frozen=True)
class ExecutorPackage:
    """The two files a cluster's executors get.

    Attributes:
        environment: the packed dependencies (`.tar.gz`), for `spark.archives`.
        code: the zip of the `keyshift` package and `infra/stack.env`, for `spark.archives`.
    """

    environment: Path
    code: Path

    def spark_conf(self) -> dict[str, str]:
        """The Spark settings that ship it (pyspark's "Using Virtualenv"): `spark.archives` (both),
        `spark.executorEnv.PYTHONPATH` (the code's folder), `spark.pyspark.python` (the
        executors' interpreter)."""
        return {"spark.archives": f"{self.environment}#{ENVIRONMENT_ALIAS},{self.code}#{CODE_ALIAS}",
                "spark.executorEnv.PYTHONPATH": f"./{CODE_ALIAS}", "spark.pyspark.python": EXECUTOR_PYTHON}


def executor_requirements(pyproject: Path = PYPROJECT) -> list[str]:
    """The packages executors import: `[project.optional-dependencies] executor` of `pyproject`.

    Raises:
        StackError: the group is missing.
    """
    groups = tomllib.loads(pyproject.read_text())["project"].get("optional-dependencies", {})
    if not groups.get("executor"):
        raise StackError(f"{pyproject} has no [project.optional-dependencies] executor: nothing to pack for executors")
    return list(groups["executor"])


def _digest(*parts: bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(len(part).to_bytes(8, "big") + part)
    return digest.hexdigest()[:12]


def package_dir(settings: Settings) -> Path:
    """`<cache>/executor-env`, where the archives are kept."""
    return settings.cache / "executor-env"


def environment_archive(settings: Settings, python: str | None = None) -> Path:
    """The path of the dependencies' archive for the current lock file, requirement list and
    interpreter: `<cache>/executor-env/environment-<digest>.tar.gz`."""
    key = _digest(LOCK_FILE.read_bytes(), "\n".join(executor_requirements()).encode(), (python or "").encode(),
                  sys.version.encode())
    return package_dir(settings) / f"environment-{key}.tar.gz"


def _code_files() -> list[Path]:
    """The files of the code zip: the `keyshift` package's sources and `infra/stack.env`."""
    from keyshift.stack_env import STACK_ENV_FILE

    return sorted(p for p in PACKAGE_DIR.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc") \
        + [STACK_ENV_FILE]


def code_archive(settings: Settings) -> Path:
    """The path of the code zip for the current sources: `<cache>/executor-env/keyshift-<digest>.zip`."""
    sources = _code_files()
    key = _digest(*(str(p.relative_to(PROJECT_ROOT)).encode() + b"\0" + p.read_bytes() for p in sources))
    return package_dir(settings) / f"keyshift-{key}.zip"


def build_code(settings: Settings) -> Path:
    """Zip the `keyshift` package (sources only) and `infra/stack.env` unless the zip of these
    files exists; returns it."""
    target = code_archive(settings)
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in _code_files():
            archive.write(path, path.relative_to(PROJECT_ROOT))
    partial.replace(target)
    log.info("packed keyshift's code into %s", target)
    return target


def build_environment(settings: Settings, python: str | None = None, base_python: str | None = None) -> Path:
    """Build and pack the executors' environment unless the archive for these inputs exists.

    A fresh venv of `base_python` (default: this venv's base interpreter), `pip install` of
    `executor_requirements()` constrained by `requirements.lock`, packed by venv-pack.

    Args:
        settings: where the cache is. python: the interpreter path the workers have, when not
            the base interpreter's (venv-pack's `python_prefix`). base_python: the interpreter
            the venv is made from.

    Returns:
        The archive's path.

    Raises:
        StackError: the venv or pip failed (pip's last lines in the message).
    """
    import venv_pack

    target = environment_archive(settings, python)
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    base = base_python or getattr(sys, "_base_executable", sys.executable)
    with tempfile.TemporaryDirectory(prefix="keyshift-executor-env-", dir=target.parent) as folder:
        env = Path(folder) / "env"
        steps = [[base, "-m", "venv", str(env)],
                 [str(env / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                  "-c", str(LOCK_FILE), *executor_requirements()]]
        for step in steps:
            log.info("executor environment: %s", " ".join(step[:6]) + (" ..." if len(step) > 6 else ""))
            done = subprocess.run(step, capture_output=True, text=True)
            if done.returncode != 0:
                raise StackError(f"building the executors' environment failed at `{' '.join(step[:5])} ...`: "
                                 f"{(done.stderr or done.stdout).strip()[-1500:]}")
        partial = target.with_name(target.name + ".partial.tar.gz")
        venv_pack.pack(prefix=str(env), output=str(partial), python_prefix=python, force=True)
        partial.replace(target)
    log.info("packed the executors' environment into %s (%.0f MB)", target, target.stat().st_size / 1e6)
    return target


def build(settings: Settings, python: str | None = None) -> ExecutorPackage:
    """Both archives, each built only when its inputs changed (`build_environment`, `build_code`).

    Raises:
        StackError: the environment cannot be built.
    """
    return ExecutorPackage(build_environment(settings, python), build_code(settings))
