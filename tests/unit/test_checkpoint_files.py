"""Checkpoint locations: local paths and Hadoop URIs, and reading a local one's files."""

from __future__ import annotations

from pathlib import Path

import pytest

from keyshift.checkpoint_files import CheckpointFiles, checkpoint_name, is_uri, join, sibling
from keyshift.errors import ConfigurationError


@pytest.mark.parametrize(("location", "uri"), [
    ("hdfs://127.0.0.1:8020/keyshift/r/checkpoint", True), ("s3a://bucket/r/checkpoint", True),
    ("/work/runs/r/checkpoint", False), ("runs/r/checkpoint", False), ("file:///work/runs/r/checkpoint", False),
    (Path("/work/runs/r"), False),
])
def test_a_uri_is_one_with_a_scheme_other_than_file(location, uri):
    assert is_uri(location) is uri


def test_join_keeps_a_uri_a_string_and_a_path_a_path():
    assert join("hdfs://nn:8020/k/", "r", "checkpoint") == "hdfs://nn:8020/k/r/checkpoint"
    assert join("/work/runs", "r", "checkpoint") == Path("/work/runs/r/checkpoint")
    assert join("file:///work/runs", "r") == Path("/work/runs/r")


def test_names_of_checkpoints_and_their_siblings():
    assert checkpoint_name("hdfs://nn:8020/k/r/checkpoint-2/") == "checkpoint-2"
    assert checkpoint_name(Path("/runs/r/checkpoint")) == "checkpoint"
    assert sibling("hdfs://nn:8020/k/r/checkpoint", "checkpoint-1") == "hdfs://nn:8020/k/r/checkpoint-1"
    assert sibling("checkpoint", "checkpoint-1") == "checkpoint-1"  # a segment's name under its run folder
    assert sibling("/data/checkpoints/r/checkpoint", "checkpoint-1") == "/data/checkpoints/r/checkpoint-1"  # a local location


@pytest.mark.parametrize("where", ["run folder", "local location", "hdfs"])
def test_a_run_is_resumable_once_its_first_checkpoint_has_an_offset_log(tmp_path, where):
    import json

    from keyshift.processing.job_record import has_checkpoint

    run_dir = tmp_path / "runs" / "r"
    run_dir.mkdir(parents=True)
    assert not has_checkpoint(run_dir)
    first = {"run folder": "checkpoint", "local location": str(tmp_path / "ck" / "r" / "checkpoint"),
             "hdfs": "hdfs://127.0.0.1:8020/ck/r/checkpoint"}[where]
    (run_dir / "job.json").write_text(json.dumps({"segments": [{"checkpoint": first}]}))
    if where == "hdfs":  # read only by a driver with a SparkSession: the job record says the query started
        assert has_checkpoint(run_dir)
        return
    assert not has_checkpoint(run_dir)
    offsets = (run_dir / first if where == "run folder" else Path(first)) / "offsets"
    offsets.mkdir(parents=True)
    assert has_checkpoint(run_dir)


def test_a_local_checkpoints_files(tmp_path):
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "0").write_text("v1\n{}\n")
    files = CheckpointFiles(tmp_path)
    assert files.exists() and files.exists("offsets/0") and not files.exists("commits")
    assert files.names("offsets") == ["0"] and files.names("commits") == []
    assert files.read_text("offsets/0") == "v1\n{}\n"
    assert files.modified_s("offsets/0") > 0
    with pytest.raises(FileNotFoundError):
        files.read_text("commits/0")


def test_a_hadoop_uri_needs_the_drivers_spark_session(monkeypatch):
    from pyspark.sql import SparkSession

    monkeypatch.setattr(SparkSession, "getActiveSession", staticmethod(lambda: None))
    with pytest.raises(ConfigurationError, match="needs a SparkSession"):
        CheckpointFiles("hdfs://127.0.0.1:8020/k/r/checkpoint")
