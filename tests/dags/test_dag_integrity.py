"""DAG integrity: every file in dags/ imports cleanly, follows the project's DAG policy, and
does no I/O while it is imported (the Astronomer integrity-test shape, without monkeypatching:
our DAG files touch nothing at import, so there is nothing to patch).

Policy (STYLE.md, DESIGN.md):
- every DAG has tags, a doc_md, a timezone-aware start date and `catchup=False`;
- no task retries automatically (`retries` missing counts as 0): a retried replay would
  produce its events twice and the run's summary would no longer reconcile; a run is retried
  by triggering a new one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DAGS_DIR = REPO / "dags"
DAG_FILES = sorted(p for p in DAGS_DIR.glob("*.py") if not p.name.startswith("_"))
MAX_RETRIES = 0
IMPORT_BUDGET_S = 60.0
"""Seconds an isolated `python` may take to import a DAG file, Airflow itself included."""


@pytest.fixture(scope="module")
def dag_bag():
    """One DagBag of dags/ (no example DAGs: Airflow 3.3's DagBag reads only the folder given)."""
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS_DIR))


def _dags_of(dag_bag, path: Path):
    return [dag for dag in dag_bag.dags.values() if Path(dag.fileloc).resolve() == path.resolve()]


def test_dags_folder_has_files():
    assert DAG_FILES, f"no DAG files in {DAGS_DIR}"


@pytest.mark.parametrize("path", DAG_FILES, ids=[p.name for p in DAG_FILES])
def test_file_imports(dag_bag, path):
    """One case per file: its import error, if any, is the failure message."""
    errors = {Path(k).name: v for k, v in dag_bag.import_errors.items()}
    assert path.name not in errors, f"{path.name} failed to import:\n{errors[path.name]}"
    assert _dags_of(dag_bag, path), f"{path.name} defines no DAG"


@pytest.mark.parametrize("path", DAG_FILES, ids=[p.name for p in DAG_FILES])
def test_dag_policy(dag_bag, path):
    for dag in _dags_of(dag_bag, path):
        assert dag.tags, f"{dag.dag_id} in {path.name} has no tags"
        assert dag.doc_md, f"{dag.dag_id} in {path.name} has no doc_md (use the module docstring)"
        assert dag.start_date is not None and dag.start_date.tzinfo is not None, (
            f"{dag.dag_id}: start_date must be timezone-aware (UTC)"
        )
        assert dag.catchup is False, f"{dag.dag_id}: catchup must be False"
        default_retries = dag.default_args.get("retries", 0)
        assert default_retries <= MAX_RETRIES, f"{dag.dag_id}: default retries {default_retries} > {MAX_RETRIES}"
        for task in dag.tasks:
            retries = task.retries if task.retries is not None else 0
            assert retries <= MAX_RETRIES, f"{dag.dag_id}.{task.task_id}: retries {retries} > {MAX_RETRIES}"


# Runs in a fresh interpreter with an audit hook installed before the DAG file is imported.
# An event counts as the DAG's I/O when, walking the stack outward from it, a frame of this
# repository (dags/ or keyshift/) comes before any import machinery: code of ours ran it. An
# event raised while a third-party module executes its own top level on first import (Airflow
# lazily imports croniter, which runs `file -b python` to learn the word size) is that library's
# set-up, not ours, and is reported separately for information.
_PROBE = textwrap.dedent(
    """
    import importlib.util, os, sys, time
    REPO_PREFIXES = tuple(os.path.join(sys.argv[2], d) + os.sep for d in ("dags", "keyshift"))
    WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    ours, theirs = [], []

    def caused_by_us():
        frame = sys._getframe(2)
        while frame is not None:
            name = frame.f_code.co_filename
            if name.startswith("<frozen importlib"):
                return False
            if name.startswith(REPO_PREFIXES):
                return True
            frame = frame.f_back
        return False

    def describe(event, args):
        if event == "socket.connect":
            return f"socket.connect {args[1]!r}"
        if event in ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.fork"):
            return f"{event} {args[:2]!r}"
        if event == "open" and isinstance(args[0], (str, bytes)):
            mode, flags = args[1], args[2] or 0
            if (isinstance(mode, str) and any(c in mode for c in "wax+")) or (flags & WRITE_FLAGS):
                if "__pycache__" not in str(args[0]):
                    return f"open for write {args[0]!r}"
        return None

    def hook(event, args):
        text = describe(event, args)
        if text is not None:
            (ours if caused_by_us() else theirs).append(text)

    sys.addaudithook(hook)
    start = time.monotonic()
    spec = importlib.util.spec_from_file_location("dag_under_test", sys.argv[1])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    elapsed = time.monotonic() - start
    for e in ours:
        print("IO:", e)
    for e in theirs:
        print("THIRD-PARTY-IMPORT-IO:", e)
    print(f"ELAPSED {elapsed:.3f}")
    """
)


@pytest.mark.parametrize("path", DAG_FILES, ids=[p.name for p in DAG_FILES])
def test_import_does_no_io(path, tmp_path):
    """Importing a DAG file opens no socket, starts no process and writes no file.

    The services it would reach are pointed at a closed port on loopback and a runs folder that
    does not exist, so a connection attempt would also fail; the audit hook catches it first.
    """
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path / "airflow"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "KEYSHIFT_KAFKA_PORT": "1",
        "KEYSHIFT_REDIS_PORT": "1",
        "KEYSHIFT_AIRFLOW_PORT": "1",
        "KEYSHIFT_RUNS_DIR": str(tmp_path / "absent-runs"),
        "KEYSHIFT_HOME": str(tmp_path / "absent-home"),
    }
    # Warm-up run: Airflow writes its own airflow.cfg into a new AIRFLOW_HOME on first import.
    subprocess.run([sys.executable, "-c", "import airflow.sdk"], env=env, capture_output=True, timeout=120)
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, str(path), str(REPO)], env=env, capture_output=True, text=True,
        timeout=IMPORT_BUDGET_S, cwd=tmp_path,
    )
    wall = time.monotonic() - started
    assert proc.returncode == 0, f"importing {path.name} failed:\n{proc.stderr[-3000:]}"
    io_events = [line for line in proc.stdout.splitlines() if line.startswith("IO:")]
    assert not io_events, f"importing {path.name} did I/O:\n" + "\n".join(io_events)
    elapsed = float(next(line for line in proc.stdout.splitlines() if line.startswith("ELAPSED")).split()[1])
    assert elapsed < 10.0, f"importing {path.name} took {elapsed:.1f} s after Airflow was loaded"
    assert not (tmp_path / "absent-runs").exists(), "the DAG file created the runs folder at import"
    assert wall < IMPORT_BUDGET_S
