"""Tumbling window arithmetic in integer milliseconds."""

import numpy as np
import pytest

from keyshift.eventtime.windows import HOUR_MS, window_closed, window_start_ms, window_starts_ms

JAN_1_2001_MS = 978_307_200_000  # 2001-01-01T00:00:00Z


@pytest.mark.parametrize(
    ("event_time_ms", "size_ms", "start"),
    [
        (0, HOUR_MS, 0),  # the epoch starts a window
        (HOUR_MS - 1, HOUR_MS, 0),  # last millisecond of the first hour
        (HOUR_MS, HOUR_MS, HOUR_MS),  # the end is exclusive: next window
        (JAN_1_2001_MS + 60_000, HOUR_MS, JAN_1_2001_MS),  # first flight of the data set
        (-1, HOUR_MS, -HOUR_MS),  # before 1970: floor, not truncation
        (17, 5, 15),  # any size
    ],
)
def test_window_start(event_time_ms, size_ms, start):
    assert window_start_ms(event_time_ms, size_ms) == start
    assert window_starts_ms(np.array([event_time_ms]), size_ms)[0] == start


@pytest.mark.parametrize("size_ms", [0, -HOUR_MS])
def test_window_size_must_be_positive(size_ms):
    with pytest.raises(ValueError, match="window size"):
        window_start_ms(0, size_ms)
    with pytest.raises(ValueError, match="window size"):
        window_starts_ms(np.array([0]), size_ms)


@pytest.mark.parametrize(
    ("end", "watermark", "closed"),
    [
        (HOUR_MS, HOUR_MS - 1, False),  # watermark one ms short of the end
        (HOUR_MS, HOUR_MS, True),  # watermark at the end closes it
        (HOUR_MS, HOUR_MS + 1, True),
    ],
)
def test_window_closed(end, watermark, closed):
    assert window_closed(end, watermark) is closed
