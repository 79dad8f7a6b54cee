"""The plain YSB baseline's results check (`compare_to_expected`) on hand-made frames, and the
shuffle-bytes reader's filtering and refusals (`keyshift.monitoring.shuffle`) against a fake
session and a fake REST answer (the real API: tests/integration/test_plain_ysb.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

from keyshift.bench.plain_ysb import compare_to_expected
from keyshift.errors import ConfigurationError, DataError, JobError

T0 = 1_700_000_000_000  # a multiple of 10,000 ms


@pytest.fixture
def expected_path(tmp_path):
    """The generator's record: campaigns a and b, windows at T0, T0 + 10 s, T0 + 20 s."""
    path = tmp_path / "expected_views.parquet"
    pd.DataFrame({"campaign_id": ["a", "a", "a", "b", "b", "b"],
                  "window_start_ms": [T0, T0 + 10_000, T0 + 20_000] * 2,
                  "views": [3, 1, 4, 1, 5, 9]}).astype({"window_start_ms": "int64", "views": "int64"}).to_parquet(path, index=False)
    return path


def _ours(rows):
    return pd.DataFrame(rows, columns=["campaign_id", "window_start_ms", "count"])


def test_the_windows_the_watermark_closed_are_compared(expected_path):
    ours = _ours([("a", T0, 3), ("a", T0 + 10_000, 1), ("b", T0, 1), ("b", T0 + 10_000, 5)])
    check = compare_to_expected(ours, expected_path, watermark_ms=T0 + 20_000)  # closes the first two windows only
    assert check == {"windows": 4, "expected_windows": 4, "mismatched": 0, "missing": 0, "unexpected": 0, "duplicated": 0,
                     "watermark_ms": T0 + 20_000, "identical": True}
    # one ms short of a window's end leaves it open
    assert compare_to_expected(ours, expected_path, watermark_ms=T0 + 19_999)["unexpected"] == 2


def test_a_wrong_count_a_missing_window_and_an_extra_one_are_each_counted(expected_path):
    ours = _ours([("a", T0, 2), ("b", T0, 1), ("b", T0 + 10_000, 5), ("c", T0, 7)])
    check = compare_to_expected(ours, expected_path, watermark_ms=T0 + 20_000)
    assert (check["mismatched"], check["missing"], check["unexpected"], check["identical"]) == (1, 1, 1, False)
    assert check["windows"] == 4 and check["expected_windows"] == 4


def test_a_window_written_twice_is_not_identical(expected_path):
    ours = _ours([("a", T0, 3), ("a", T0, 3), ("b", T0, 1)])
    check = compare_to_expected(ours, expected_path, watermark_ms=T0 + 10_000)
    assert check["duplicated"] == 1 and not check["identical"]


def test_timestamps_redis_counts_and_an_inferred_watermark(expected_path):
    # Spark's Parquet shape: naive UTC timestamps; Redis' shape: seen_count
    ours = pd.DataFrame({"campaign_id": ["a", "b"], "window_start": pd.to_datetime([T0, T0], unit="ms"),
                         "window_end": pd.to_datetime([T0 + 10_000] * 2, unit="ms"), "count": [3, 1]})
    check = compare_to_expected(ours, expected_path)
    assert check["identical"] and check["watermark_ms"] == T0 + 10_000 and check["expected_windows"] == 2
    aware = ours.assign(window_start=ours["window_start"].dt.tz_localize("UTC").dt.tz_convert("America/New_York"))
    assert compare_to_expected(aware, expected_path)["identical"]
    redis_shape = pd.DataFrame({"campaign_id": ["a"], "window_start_ms": [T0], "seen_count": [3], "time_updated": [1]})
    assert compare_to_expected(redis_shape, expected_path, watermark_ms=T0 + 10_000)["missing"] == 1  # b's window


def test_unreadable_inputs_are_refused(expected_path, tmp_path):
    with pytest.raises(DataError, match="expected_views"):
        compare_to_expected(_ours([]), tmp_path / "ysb-none" / "expected_views.parquet")
    with pytest.raises(DataError, match="campaign_id"):
        compare_to_expected(pd.DataFrame({"campaign": ["a"], "count": [1]}), expected_path)


def _fake_session(ui="http://127.0.0.1:4040", retained="1000"):
    bus = SimpleNamespace(waitUntilEmpty=lambda ms: None)
    jsc = SimpleNamespace(sc=lambda: SimpleNamespace(listenerBus=lambda: bus))
    context = SimpleNamespace(uiWebUrl=ui, applicationId="local-1", _jsc=jsc)
    return SimpleNamespace(sparkContext=context, conf=SimpleNamespace(get=lambda key, default=None: retained))


def _stage(stage_id, run_id, batch, written, status="COMPLETE", input_records=0):
    description = f"\nid = q\nrunId = {run_id}\nbatch = {batch}" if run_id else None
    return {"stageId": stage_id, "attemptId": 0, "status": status, "name": f"stage {stage_id}", "description": description,
            "shuffleWriteBytes": written, "shuffleWriteRecords": written // 10, "shuffleReadBytes": 0, "inputRecords": input_records}


def _answer(monkeypatch, stages):
    asked = []

    def get(url, timeout):
        asked.append(url)
        return SimpleNamespace(raise_for_status=lambda: None, json=lambda: stages)

    monkeypatch.setattr("keyshift.monitoring.shuffle.requests.get", get)
    return asked


def test_shuffle_bytes_count_complete_stages_of_the_asked_query(monkeypatch):
    from keyshift.monitoring.shuffle import shuffle_bytes_by_stage, shuffle_write_bytes

    stages = [_stage(0, None, 0, 500), _stage(1, "r1", 0, 100, input_records=7), _stage(2, "r1", 0, 0),
              _stage(3, "r1", 1, 50, status="SKIPPED"), _stage(4, "r2", 0, 70), _stage(5, "r1", 1, 30, status="FAILED")]
    asked = _answer(monkeypatch, stages)
    spark = _fake_session()
    assert shuffle_write_bytes(spark) == 500 + 100 + 70
    assert shuffle_write_bytes(spark, query_run_id="r1") == 100
    picked = shuffle_bytes_by_stage(spark, query_run_id="r1")
    assert [(s.stage_id, s.batch_id, s.input_records) for s in picked] == [(1, 0, 7), (2, 0, 0)]
    assert asked[0] == "http://127.0.0.1:4040/api/v1/applications/local-1/stages"


def test_stages_dropped_by_the_ui_retention_are_refused(monkeypatch):
    from keyshift.monitoring.shuffle import shuffle_write_bytes

    _answer(monkeypatch, [_stage(900, "old", 0, 5), _stage(901, "r1", 0, 100), _stage(902, "r1", 1, 100)])
    spark = _fake_session()
    with pytest.raises(JobError, match="spark.ui.retainedStages"):
        shuffle_write_bytes(spark)  # stages 0 to 899 of the application are gone
    assert shuffle_write_bytes(spark, query_run_id="r1") == 200  # an older stage is still there: none of r1's is gone
    _answer(monkeypatch, [_stage(901, "r1", 0, 100), _stage(902, "r1", 1, 100)])
    with pytest.raises(JobError, match="retainedStages"):
        shuffle_write_bytes(spark, query_run_id="r1")  # r1's first retained stage is the oldest: earlier ones may be gone


def test_a_session_without_ui_is_refused():
    from keyshift.monitoring.shuffle import shuffle_write_bytes

    with pytest.raises(ConfigurationError, match="spark.ui.enabled"):
        shuffle_write_bytes(_fake_session(ui=None))
