"""The flights-3m input: fetch it from the npm package vega-datasets, verify it, cache it.

3,000,000 US domestic flights, 2001-01-01 .. 2001-07-01, one row per flight with columns `date`
(naive timestamp[us], UTC), `delay` (minutes), `distance` (miles), `origin`, `destination`
(IATA airport codes). The rows are sorted by `date`.

Where it comes from: the file `data/flights-3m.parquet` of the npm package vega-datasets@3.2.1,
downloaded with the ordinary npm client (`npm pack`, so the machine's npm configuration and cache
apply). Two pins guard it: the SHA-256 of the package tarball and the SHA-256 of the extracted
file, plus its row count and column names read from the Parquet footer. The file is written under
a temporary name beside its destination and renamed into place only once verified, so a reader
never sees a partial file; a cached file that fails verification is fetched again, never used.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from keyshift.errors import DataError
from keyshift.settings import Settings

log = logging.getLogger(__name__)

_CHUNK = 1 << 20


@dataclass(frozen=True)
class PackagedFile:
    """A data file inside an npm package, with the pins that verify it.

    Attributes:
        package: npm spec `name@version`, passed to `npm pack`.
        tarball_sha256: SHA-256 (hex) of the package tarball.
        member: the file's path inside the tarball (`package/...`).
        file_name: name of the cached copy.
        sha256: SHA-256 (hex) of the extracted file.
        rows: row count the Parquet footer must report.
        columns: column names, in order, the Parquet schema must have.
    """

    package: str
    tarball_sha256: str
    member: str
    file_name: str
    sha256: str
    rows: int
    columns: tuple[str, ...]


FLIGHTS_3M = PackagedFile(
    package="vega-datasets@3.2.1",
    tarball_sha256="6f72fda460a9863fae5fcb32f85bcd49e1761fdea6dc6cf9f4962472881cc5a3",
    member="package/data/flights-3m.parquet",
    file_name="flights-3m.parquet",
    sha256="dbeb920c90f59b6ccaff823dcc3d08f25a97fa1ce128d93f40be4e931f5900b0",
    rows=3_000_000,
    columns=("date", "delay", "distance", "origin", "destination"),
)
"""The pinned flights-3m file (13,493,022 bytes; tarball 17,630,305 bytes)."""

Packer = Callable[[str, Path], Path]
"""Downloads an npm package spec into a directory and returns the tarball's path."""


def flights_dir(settings: Settings) -> Path:
    """Cache folder of the flights input: `settings.cache / "flights"`."""
    return settings.cache / "flights"


def sha256_of(path: Path) -> str:
    """SHA-256 (lowercase hex) of a file's bytes, read in 1 MiB chunks.

    Raises:
        OSError: if the file cannot be read.
    """
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def verify_file(path: Path, pinned: PackagedFile = FLIGHTS_3M) -> None:
    """Check a cached or freshly extracted file against its pins.

    Checks, in order: the file exists, its SHA-256 equals `pinned.sha256`, its Parquet footer
    reports `pinned.rows` rows and exactly the columns `pinned.columns`.

    Raises:
        DataError: naming the file, the check that failed, the expected and the actual value.
    """
    if not path.is_file():
        raise DataError(f"{path} does not exist")
    actual = sha256_of(path)
    if actual != pinned.sha256:
        raise DataError(
            f"{path} has SHA-256 {actual}, expected {pinned.sha256} "
            f"({path.stat().st_size:,} bytes; corrupt, partial or a different file)"
        )
    try:
        metadata = pq.ParquetFile(path).metadata
        schema = metadata.schema.to_arrow_schema()
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{path} is not a readable Parquet file: {exc}") from exc
    if metadata.num_rows != pinned.rows:
        raise DataError(f"{path} has {metadata.num_rows:,} rows, expected {pinned.rows:,}")
    if tuple(schema.names) != pinned.columns:
        raise DataError(f"{path} has columns {list(schema.names)}, expected {list(pinned.columns)}")


def npm_pack(spec: str, directory: Path) -> Path:
    """Download the tarball of npm package `spec` into `directory` with `npm pack`.

    Uses the ordinary npm client, so registry, proxy and cache settings of the machine apply.

    Returns:
        The path of the `.tgz` npm wrote.

    Raises:
        DataError: if npm is not installed, exits non-zero, or writes no tarball.
    """
    npm = shutil.which("npm")
    if npm is None:
        raise DataError("npm is not installed; install Node.js with npm (Debian: apt-get install npm)")
    completed = subprocess.run(
        [npm, "pack", spec, "--pack-destination", str(directory)],
        cwd=directory,
        capture_output=True,
        text=True,
        check=False,
    )
    if completed.returncode != 0:
        raise DataError(f"`npm pack {spec}` failed (exit {completed.returncode}): {completed.stderr.strip()[-2000:]}")
    tarballs = sorted(directory.glob("*.tgz"))
    if len(tarballs) != 1:
        raise DataError(f"`npm pack {spec}` wrote {len(tarballs)} tarballs in {directory}, expected 1")
    return tarballs[0]


def fetch_packaged_file(pinned: PackagedFile, directory: Path, force: bool = False, pack: Packer = npm_pack) -> Path:
    """Fetch, verify and cache one file of an npm package; reuse a cached copy that verifies.

    Steps: reuse `directory / pinned.file_name` if it verifies (unless `force`); otherwise
    download the tarball into a temporary folder with `pack`, check its SHA-256, extract
    `pinned.member` to a temporary name in `directory`, verify it (`verify_file`), and rename it
    into place atomically. A cached file that fails verification is logged and replaced.

    Args:
        pinned: the file and its pins.
        directory: cache folder; created if missing.
        force: download again even when the cached copy verifies.
        pack: the downloader (default `npm_pack`); tests pass a local one.

    Returns:
        The path of the verified cached file.

    Raises:
        DataError: download failed, the tarball's or the file's SHA-256 differs from its pin
            (the message names expected and actual), the member is missing, or the Parquet
            footer does not match.
    """
    target = directory / pinned.file_name
    if target.exists() and not force:
        try:
            verify_file(target, pinned)
        except DataError as exc:
            log.warning("cached %s failed verification, fetching it again: %s", target, exc)
        else:
            log.info("using cached %s (SHA-256 verified)", target)
            return target
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="keyshift-npm-") as scratch:
        log.info("downloading %s with npm pack", pinned.package)
        tarball = pack(pinned.package, Path(scratch))
        actual = sha256_of(tarball)
        if actual != pinned.tarball_sha256:
            raise DataError(
                f"tarball of {pinned.package} has SHA-256 {actual}, expected {pinned.tarball_sha256}; "
                "the package changed or the download is corrupt"
            )
        log.info("verified %s (%s bytes, SHA-256 %s)", tarball.name, f"{tarball.stat().st_size:,}", actual[:12])
        partial = _extract_member(tarball, pinned.member, directory)
    try:
        verify_file(partial, pinned)
        partial.chmod(0o644)
        os.replace(partial, target)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    log.info("cached %s (%s rows, SHA-256 verified)", target, f"{pinned.rows:,}")
    return target


def _extract_member(tarball: Path, member: str, directory: Path) -> Path:
    """Copy one tarball member to a fresh temporary file in `directory`; return its path."""
    try:
        with tarfile.open(tarball, "r:gz") as archive:
            try:
                source = archive.extractfile(member)
            except KeyError:
                source = None
            if source is None:
                raise DataError(f"{tarball.name} has no file {member}")
            handle = tempfile.NamedTemporaryFile(
                dir=directory, prefix=f".{Path(member).name}.", suffix=".part", delete=False
            )
            with source, handle:
                shutil.copyfileobj(source, handle, _CHUNK)
                handle.flush()
                os.fsync(handle.fileno())
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise DataError(f"cannot extract {member} from {tarball.name}: {exc}") from exc
    return Path(handle.name)


def fetch_flights(settings: Settings, force: bool = False) -> Path:
    """Fetch flights-3m into `settings.cache / "flights"` and return its verified path.

    Downloads vega-datasets@3.2.1 with `npm pack` only when no verified copy is cached (or when
    `force`); see `fetch_packaged_file` for the steps and `FLIGHTS_3M` for the pins.

    Raises:
        DataError: download or verification failed (names expected and actual checksums).
    """
    return fetch_packaged_file(FLIGHTS_3M, flights_dir(settings), force=force)


def flights_path(settings: Settings) -> Path:
    """The verified cached flights-3m file (3,000,000 rows), without any download.

    Raises:
        DataError: the file is missing or fails verification; the message says to run
            `keyshift data fetch flights`.
    """
    path = flights_dir(settings) / FLIGHTS_3M.file_name
    try:
        verify_file(path, FLIGHTS_3M)
    except DataError as exc:
        raise DataError(f"flights data not usable ({exc}); run `keyshift data fetch flights`") from exc
    return path
