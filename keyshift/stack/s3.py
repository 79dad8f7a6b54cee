"""An S3-compatible object store on loopback, for checkpoints on `s3a://` as on a cloud cluster.

Not part of the default stack: `keyshift stack up --only s3` (or `--cluster`) starts it. It is
moto's S3 server (`moto_server`, the PyPI package `moto[server]`), which speaks the S3 REST API
that Hadoop's S3A connector (`keyshift.stack.s3a`) talks to AWS with; its bucket `BUCKET` is
created once the server answers, so `KEYSHIFT_CHECKPOINT_LOCATION=s3a://keyshift/checkpoints` with
`KEYSHIFT_S3_ENDPOINT=http://127.0.0.1:9000` works against it.

moto pins Flask and Werkzeug at versions of its own, so it runs from a virtual environment of its
own (`<cache>/s3-server`), installed once from `infra/s3/requirements.txt` (about 30 s). moto
checks no signature: any access key is accepted. What the store holds lives in the server's
memory only as long as the process (a test store, not a data store).
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import requests

from keyshift.errors import StackError
from keyshift.settings import PROJECT_ROOT, Settings
from keyshift.stack import process
from keyshift.stack.service import BLOCKED, EXTERNAL, HEALTHY, STOPPED, UNHEALTHY, ProcessState, ServiceStatus

log = logging.getLogger("keyshift.stack.s3")

NAME = "s3"
"""The service's name and its process's (pid file `run/s3.pid`, log `logs/s3.log`)."""
REQUIREMENTS = PROJECT_ROOT / "infra" / "s3" / "requirements.txt"
"""The server's packages at tested versions (moto[server] and its dependencies)."""
BUCKET = "keyshift"
"""The bucket the service creates: checkpoints go under `s3a://keyshift/...`."""


def endpoint(settings: Settings) -> str:
    """The server's S3 endpoint: `http://127.0.0.1:<s3_port>`."""
    return f"http://127.0.0.1:{settings.s3_port}"


def server_env(settings: Settings) -> Path:
    """`<cache>/s3-server`, the server's own virtual environment."""
    return settings.cache / "s3-server"


def install(settings: Settings) -> Path:
    """Create the server's virtual environment from `REQUIREMENTS`, unless an earlier call did.

    Returns:
        The path of its `moto_server` script.

    Raises:
        StackError: when `venv` or pip fails (the message quotes pip's output).
    """
    folder = server_env(settings)
    script = folder / "bin" / "moto_server"
    digest = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:16]
    stamp = folder / f".installed-{digest}"
    if stamp.exists() and script.exists():
        return script
    shutil.rmtree(folder, ignore_errors=True)
    log.info("Installing the S3 server (moto) into %s; once, about 30 s", folder)
    base = getattr(sys, "_base_executable", None) or sys.executable
    for argv in ([base, "-m", "venv", str(folder)],
                 [str(folder / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check", "-r", str(REQUIREMENTS)]):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
        if done.returncode != 0:
            shutil.rmtree(folder, ignore_errors=True)
            raise StackError(f"installing the S3 server failed ({' '.join(argv[:3])} ...):\n{(done.stderr or done.stdout)[-2000:]}")
    stamp.touch()
    return script


def argv(settings: Settings) -> list[str]:
    """The server's command line (`moto_server -H 127.0.0.1 -p <s3_port>`), installing it first."""
    return [str(install(settings)), "-H", "127.0.0.1", "-p", str(settings.s3_port)]


def _answers(settings: Settings) -> bool:
    """True when the endpoint answers S3's ListBuckets."""
    try:
        return requests.get(endpoint(settings) + "/", timeout=2.0).status_code == 200
    except requests.RequestException:
        return False


def _has_bucket(settings: Settings) -> bool:
    try:
        return requests.head(f"{endpoint(settings)}/{BUCKET}", timeout=2.0).status_code == 200
    except requests.RequestException:
        return False


def is_healthy(settings: Settings) -> bool:
    """True when the server answers and holds `BUCKET`."""
    return _answers(settings) and _has_bucket(settings)


def start(settings: Settings) -> bool:
    """Start the server unless it runs; do not wait (`wait_healthy` creates the bucket).

    Returns:
        True when it was started, False when it was running.

    Raises:
        StackError: the port is taken by something keyshift did not start, or the install failed.
    """
    if process.is_running(settings.home, NAME):
        return False
    process.refuse_taken_port(settings.s3_port, "KEYSHIFT_S3_PORT")
    process.start(settings.home, NAME, argv(settings), cwd=settings.home)
    return True


def create_bucket(settings: Settings) -> None:
    """Create `BUCKET` (S3 CreateBucket, path style; creating an existing one is a no-op in moto).

    Raises:
        StackError: the server refused it.
    """
    response = requests.put(f"{endpoint(settings)}/{BUCKET}", timeout=10.0)
    if response.status_code != 200:
        raise StackError(f"the S3 server at {endpoint(settings)} refused to create bucket {BUCKET}: "
                         f"HTTP {response.status_code} {response.text[:300]}")


def wait_healthy(settings: Settings, *, timeout_s: float) -> float:
    """Wait until the server answers, then create `BUCKET`; return the seconds waited.

    Raises:
        StackError: after `timeout_s` seconds, or as soon as the process exits (naming its log).
    """
    waited = process.wait_until(lambda: _answers(settings), timeout_s=timeout_s, what=f"the S3 server at {endpoint(settings)}",
                                log_path=process.log_file(settings.home, NAME),
                                alive=lambda: process.is_running(settings.home, NAME), interval_s=0.3)
    if not _has_bucket(settings):
        create_bucket(settings)
        log.info("Created bucket s3a://%s at %s", BUCKET, endpoint(settings))
    return waited


def stop(settings: Settings) -> bool:
    """Stop the server keyshift started (its objects go with it).

    Returns:
        True when it was running and was stopped.
    """
    return process.stop(settings.home, NAME, timeout_s=15.0)


def status(settings: Settings) -> ServiceStatus:
    """The service's state, endpoint and process."""
    record = process.running_record(settings.home, NAME)
    processes = (ProcessState(NAME, record.pid if record else None, str(process.log_file(settings.home, NAME))),)
    detail = f"S3 API (moto), bucket s3a://{BUCKET}"
    if not _answers(settings):
        return ServiceStatus(NAME, UNHEALTHY if record else STOPPED, endpoint(settings), processes, "" if not record else "not answering")
    if not record:
        return ServiceStatus(NAME, EXTERNAL if _has_bucket(settings) else BLOCKED, endpoint(settings), processes, detail)
    return ServiceStatus(NAME, HEALTHY if is_healthy(settings) else UNHEALTHY, endpoint(settings), processes, detail)
