"""DAG integrity: every file in dags/ imports cleanly, follows the project's DAG policy, and
does no I/O while it is imported (the Astronomer integrity-test shape, without monkeypatching:
our DAG files touch nothing at import, so there is nothing to patch).

Policy (STYLE.md, DESIGN.md):
- every DAG has tags, a doc_md, a timezone-aware start date and `catchup=False`;
- no task retries automatically (`retries` missing counts as 0): a retried replay would
  produce its events twice and the run's summary would no longer reconcile; a run is retried
  by triggering a new one. The one exception is a `JobSparkSubmitOperator` (the pipeline's
  `spark_submit`), at most `MAX_RESUMING_RETRIES` times: its retry resumes the run from its
  checkpoint rather than redoing it (test_airflow_e2e kills a driver mid-batch and checks the
  retried run counts every event once).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from import_probe import closed_services_env, probe_import
from keyshift.orchestration.spark_submit import JobSparkSubmitOperator

REPO = Path(__file__).resolve().parents[2]
DAGS_DIR = REPO / "dags"
DAG_FILES = sorted(p for p in DAGS_DIR.glob("*.py") if not p.name.startswith("_"))
MAX_RETRIES = 0
MAX_RESUMING_RETRIES = 1
IMPORT_BUDGET_S = 60.0
"""Seconds an isolated `python` may take to import a DAG file, Airflow itself included."""
DAGBAG_IMPORT_TIMEOUT_S = 30.0
"""Airflow's `[core] dagbag_import_timeout` default: the dag processor gives up on a DAG file whose
import takes longer. (A 10 s bound failed at 16.6 s on a 2-core machine at load 10.)"""


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
            allowed = MAX_RESUMING_RETRIES if isinstance(task, JobSparkSubmitOperator) else MAX_RETRIES
            assert retries <= allowed, f"{dag.dag_id}.{task.task_id}: retries {retries} > {allowed}"


@pytest.mark.parametrize("path", DAG_FILES, ids=[p.name for p in DAG_FILES])
def test_import_does_no_io(path, tmp_path):
    """Importing a DAG file opens no socket, starts no process and writes no file.

    The services it would reach are pointed at a closed port on loopback and a runs folder that
    does not exist, so a connection attempt would also fail; the audit hook catches it first
    (`import_probe`).
    """
    env = closed_services_env(tmp_path)
    # Warm-up run: Airflow writes its own airflow.cfg into a new AIRFLOW_HOME on first import.
    subprocess.run([sys.executable, "-c", "import airflow.sdk"], env=env, capture_output=True, timeout=120)
    probe = probe_import(path, env, tmp_path, folders=("dags", "keyshift"), timeout_s=IMPORT_BUDGET_S)
    assert not probe.io, f"importing {path.name} did I/O:\n" + "\n".join(probe.io)
    assert probe.elapsed_s < DAGBAG_IMPORT_TIMEOUT_S, f"importing {path.name} took {probe.elapsed_s:.1f} s after Airflow was loaded"
    assert not (tmp_path / "absent-runs").exists(), "the DAG file created the runs folder at import"
    assert probe.wall_s < IMPORT_BUDGET_S
