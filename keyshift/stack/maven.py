"""Fetching jars with Maven: copy a pom's dependencies into a folder, once.

The poms live in `infra/` (`infra/kafka/pom.xml`: the broker runtime; `infra/spark/pom.xml`: Spark's
Kafka connector). A fetched folder holds a manifest, `.keyshift-fetched.json`, naming its jars and
the SHA-256 of the pom that produced them: a later fetch with the same pom and all jars present
does nothing; an edited pom fetches again.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import shutil
import subprocess
import time
from pathlib import Path

from keyshift.errors import StackError

log = logging.getLogger("keyshift.stack.maven")

MANIFEST = ".keyshift-fetched.json"
"""Name of the manifest file written into a fetched folder once all its jars are there."""


def _pom_digest(pom: Path) -> str:
    return hashlib.sha256(pom.read_bytes()).hexdigest()


def fetched_jars(pom: Path, dest: Path) -> list[Path] | None:
    """The jars of a complete earlier fetch of `pom` into `dest`, or None when a fetch is needed.

    A fetch is complete when `dest` has a manifest written for the same pom content and every jar
    it names exists.
    """
    try:
        manifest = json.loads((dest / MANIFEST).read_text())
    except (FileNotFoundError, ValueError):
        return None
    if manifest.get("pom_sha256") != _pom_digest(pom):
        return None
    jars = [dest / name for name in manifest.get("jars", [])]
    if not jars or not all(jar.is_file() for jar in jars):
        return None
    return jars


def copy_dependencies(pom: Path, dest: Path, *, timeout_s: float = 900.0) -> list[Path]:
    """Copy the dependencies of `pom` (transitively) into `dest`, unless an earlier fetch did.

    Runs `mvn -q -B -f POM dependency:copy-dependencies -DoutputDirectory=TMP` into a temporary
    sibling folder and moves it into place only when Maven succeeded, so an interrupted fetch never
    looks complete. Concurrent callers (other processes too) wait for one fetch under a file lock.

    Args:
        pom: the Maven project whose dependencies to copy.
        dest: the folder to hold the jars (created; replaced when the pom changed).
        timeout_s: seconds Maven may take.

    Returns:
        The jar files in `dest`, sorted by name.

    Raises:
        StackError: when `mvn` is missing, fails, or produces no jar.
    """
    done = fetched_jars(pom, dest)
    if done is not None:
        log.debug("%s already holds the jars of %s", dest, pom)
        return done
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.with_name(dest.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one fetch at a time; the others then find it done
        done = fetched_jars(pom, dest)
        if done is not None:
            return done
        return _fetch(pom, dest, timeout_s)


def _fetch(pom: Path, dest: Path, timeout_s: float) -> list[Path]:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise StackError(
            "Maven (mvn) is not on PATH; keyshift fetches jars with it: "
            "install it with `apt-get install -y maven` (needs Java 17)"
        )
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    argv = [
        mvn, "-q", "-B", "-f", str(pom),
        "dependency:copy-dependencies", f"-DoutputDirectory={partial}",
    ]  # fmt: skip
    log.info("fetching the dependencies of %s into %s", pom, dest)
    started = time.monotonic()
    try:
        result = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise StackError(f"mvn did not finish fetching {pom} within {timeout_s:.0f} s") from exc
    if result.returncode != 0:
        output = (result.stdout + result.stderr).strip()[-4000:]
        raise StackError(f"mvn failed fetching {pom} (exit {result.returncode}):\n{output}")
    jars = sorted(path.name for path in partial.glob("*.jar"))
    if not jars:
        raise StackError(f"mvn fetched no jar for {pom} into {partial}")
    (partial / MANIFEST).write_text(
        json.dumps({"pom": str(pom), "pom_sha256": _pom_digest(pom), "jars": jars}, indent=2)
    )
    shutil.rmtree(dest, ignore_errors=True)
    partial.replace(dest)
    log.info("fetched %d jars for %s in %.1f s", len(jars), pom.parent.name, time.monotonic() - started)
    return [dest / name for name in jars]
