"""The Great Expectations suite of the windows table catches what it claims to."""

import pandas as pd
import pytest

from keyshift.quality.windows import validate_windows

H = pd.Timedelta(hours=1)
T0 = pd.Timestamp("2001-01-01", tz="UTC")


def table(**changes):
    frame = pd.DataFrame(
        {
            "origin": ["ORD", "ORD", "LGA"],
            "window_start": [T0, T0 + H, T0],
            "window_end": [T0 + H, T0 + 2 * H, T0 + H],
            "count": [5, 2, 1],
            "sum_delay_min": [150, 10, -3],
            "mean_delay_min": [30.0, 5.0, -3.0],
            "max_delay_min": [60, 9, -3],
            "alert": [True, False, False],
            "slot": [1, 1, 6],
            "epoch": [0, 0, 0],
        }
    )
    for column, values in changes.items():
        frame[column] = values
    return frame


@pytest.fixture(scope="module")
def clean():
    return validate_windows(table(), partitions=8)


def test_a_clean_table_passes(clean):
    assert clean["success"] is True, clean["failed"]
    assert clean["evaluated"] >= 15 and clean["rows"] == 3


@pytest.mark.parametrize(
    ("changes", "failing"),
    [
        ({"alert": [False, False, False]}, "expect_column_pair_values_to_be_equal"),  # alert rule broken
        ({"slot": [1, 1, 8]}, "expect_column_values_to_be_between"),  # slot outside [0, P)
        ({"window_start": [T0, T0, T0]}, "expect_compound_columns_to_be_unique"),  # ORD's window twice
        ({"max_delay_min": [20, 9, -3]}, "expect_column_pair_values_a_to_be_greater_than_b"),  # max < mean
    ],
)
def test_broken_tables_fail(changes, failing):
    result = validate_windows(table(**changes), partitions=8)
    assert result["success"] is False
    assert failing in {f["type"] for f in result["failed"]}
