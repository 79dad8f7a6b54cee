"""Exchange strategies and Local Merge's emit modes (`keyshift.processing.operators.exchange`): segments on
hand-made sequences, and partials that, merged, give the same windows whatever the mode."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from keyshift.errors import ConfigurationError
from keyshift.eventtime.windows import HOUR_MS
from keyshift.jobs.flight_delays import FLIGHT_DELAYS
from keyshift.processing.operators.exchange import Emit, check_exchange, merge_segments, parse_emit
from keyshift.processing.job_config import JobConfig
from keyshift.processing.operators.local_merge import partials_arrow
from tests.unit.test_local_merge_arrow import TOKENS, arrow_input, events, token_of


def test_parse_emit_accepts_the_three_modes_and_refuses_the_rest():
    assert parse_emit("batch") == Emit("batch") and parse_emit("window") == Emit("window")
    assert parse_emit("count:250") == Emit("count", 250) and str(parse_emit("count:250")) == "count:250"
    for bad in ("", "count", "count:0", "count:-3", "count:x", "every", "Batch"):
        with pytest.raises(ConfigurationError, match="emit mode"):
            parse_emit(bad)


def test_check_exchange_names_the_choices():
    assert check_exchange("global_merge") == "global_merge"
    with pytest.raises(ConfigurationError, match="local_merge, plain, global_merge"):
        check_exchange("keyby")


def test_segments_on_a_hand_made_sequence():
    # arrival order: key 0 in windows 0,0,10,0 (positions 0,2,3,5), key 1 in 0,10 (positions 1,4)
    keys = np.array([0, 1, 0, 0, 1, 0])
    starts = np.array([0, 0, 0, 10, 10, 0])
    assert merge_segments(Emit("batch"), keys, starts) is None
    assert merge_segments(None, keys, starts).tolist() == [0, 1, 2, 3, 4, 5]  # plain: each event alone
    assert merge_segments(Emit("count", 2), keys, starts).tolist() == [0, 0, 1, 1, 2, 2]
    # window: key 0's partial ends when it moves to window 10 and again when it comes back to 0
    assert merge_segments(Emit("window"), keys, starts).tolist() == [0, 0, 0, 1, 1, 2]


def merged_windows(partials: pd.DataFrame) -> pd.DataFrame:
    valid = partials[partials["dead_letter_reason"].isna()]
    return (valid.groupby(["origin", "window_start_ms"])
            .agg(count=("count", "sum"), sum_delay_min=("sum_delay_min", "sum"), max_delay_min=("max_delay_min", "max"))
            .sort_index())


@pytest.mark.parametrize("emit", [Emit("batch"), Emit("window"), Emit("count", 1), Emit("count", 7), Emit("count", 5_000), None])
def test_every_emit_mode_merges_to_the_same_windows(emit):
    frame = events(3_000, 5, 0.05)
    reference = merged_windows(partials_arrow(arrow_input(frame), FLIGHT_DELAYS, token_of, TOKENS, HOUR_MS).to_pandas())
    got = partials_arrow(arrow_input(frame), FLIGHT_DELAYS, token_of, TOKENS, HOUR_MS, emit=emit).to_pandas()
    assert int(got["count"].sum()) == 3_000  # every event, dead letters included, once
    pd.testing.assert_frame_equal(merged_windows(got), reference)
    valid = got[got["dead_letter_reason"].isna()]
    assert (valid["event_ids"].map(len) == valid["count"]).all()  # each partial carries its events
    if emit is None or emit == Emit("count", 1):
        assert (valid["count"] == 1).all()  # plain: a partial per event
    if emit is not None and emit.mode == "count":
        assert int(valid["count"].max()) <= emit.count


def test_emit_modes_order_by_partial_count():
    frame = events(3_000, 6, 0.0)
    rows = {str(emit): partials_arrow(arrow_input(frame), FLIGHT_DELAYS, token_of, TOKENS, HOUR_MS, emit=emit).num_rows
            for emit in (Emit("batch"), Emit("window"), Emit("count", 100), None)}
    # the slice spans 6 hours out of order: window boundaries cut more than batch, plain cuts all
    assert rows["batch"] < rows["window"] < rows["None"] == 3_000
    assert rows["batch"] <= rows["count:100"] < rows["None"]


def test_job_config_refuses_global_merge_with_key_watermarks_and_exchanges_for_key_windows():
    with pytest.raises(ConfigurationError, match="global watermark"):
        JobConfig.from_options(run_id="x", exchange="global_merge", watermark="key").check_exchange()
    with pytest.raises(ConfigurationError, match="tumbling-window jobs"):
        JobConfig.from_options(run_id="x", job="flight_delays_sliding", exchange="plain").check_exchange()
    with pytest.raises(ConfigurationError, match="emit mode"):
        JobConfig.from_options(run_id="x", emit="sometimes").check_exchange()
    JobConfig.from_options(run_id="x", exchange="global_merge").check_exchange()  # the flights in global mode: fine
