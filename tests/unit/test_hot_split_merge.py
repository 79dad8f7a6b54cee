"""hot_split in the job: a split key's events spread over its slots, its windows merged back.

The claim under test: running a key split over k slots through the real processor (pyspark's
TwsTester, one grouping key per slot token) and merging its window pieces in the sink gives
exactly the windows of the same events placed on one slot.
"""

import numpy as np
import pandas as pd
import pytest
from pyspark.sql.streaming.tws_tester import TwsTester

from keyshift.eventtime.windows import HOUR_MS
from keyshift.placement.tokens import slot_tokens
from keyshift.jobs.flight_delays import FLIGHT_DELAYS
from keyshift.processing.operators.local_merge import input_columns, partials_of, row_tokens
from keyshift.processing.operators.processor import KeyedWindowProcessor
from keyshift.processing.outputs.sinks import merge_split_windows


def partials_of_flights(events, *args, **kwargs):
    """`partials_of` for the flight delay job's spec."""
    return partials_of(events, FLIGHT_DELAYS, *args, **kwargs)

T0 = 978_307_200_000  # 2001-01-01T00:00:00Z
P = 8
TOKENS = np.array(slot_tokens(P), dtype=np.int32)
HOME = {"ORD": 1, "LGA": 2, "SFO": 6}  # each key's (first) slot
SPLIT = {"ORD": (1, 5, 0)}  # ORD is hot: its events go to slots 1, 5, 0 by event_id mod 3


def token_of(origin: str) -> int:
    return int(TOKENS[HOME[origin]])


def events(n: int, seed: int = 7) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    origins = rng.choice(["ORD", "ORD", "ORD", "LGA", "SFO"], size=n)
    return pd.DataFrame(
        {
            "origin": origins,
            "destination": "XXX",
            "delay_min": rng.integers(-20, 120, size=n),
            "distance_mi": 100,
            "event_time_ms": T0 + np.sort(rng.integers(0, 5 * HOUR_MS, size=n)),
            "event_id": np.arange(n, dtype=np.int64),
            "dead_letter_reason": None,
            "raw_value": None,
            "kafka_partition": 0,
            "kafka_offset": np.arange(n, dtype=np.int64),
        },
        columns=list(input_columns(FLIGHT_DELAYS)),
    )


def test_row_tokens_send_a_split_key_event_to_slot_of_its_id_mod_k():
    codes, names = pd.factorize(np.array(["ORD", "LGA", "ORD", "ORD", "SFO", "ORD"], dtype=object))
    ids = np.array([0, 1, 2, 3, 4, 5], dtype=np.int64)
    split_tokens = {"ORD": TOKENS[list(SPLIT["ORD"])]}
    got = row_tokens(codes, names, ids, token_of, split_tokens)
    slot_of_token = {int(t): s for s, t in enumerate(TOKENS)}
    assert [slot_of_token[int(t)] for t in got] == [1, 2, 0, 1, 6, 0]  # ORD: ids 0,2,3,5 -> 0%3,2%3,3%3,5%3
    unsplit = row_tokens(codes, names, ids, token_of)
    assert [slot_of_token[int(t)] for t in unsplit] == [1, 2, 1, 1, 6, 1]


def test_local_merge_makes_one_partial_per_window_and_piece():
    frame = events(600)
    partials = partials_of_flights(frame, token_of, TOKENS, HOUR_MS, {"ORD": TOKENS[list(SPLIT["ORD"])]})
    assert partials["count"].sum() == 600
    slot_of_token = {int(t): s for s, t in enumerate(TOKENS)}
    ord_partials = partials[partials["origin"] == "ORD"]
    assert {slot_of_token[int(t)] for t in ord_partials["token"]} == set(SPLIT["ORD"])
    for token, ids in zip(ord_partials["token"], ord_partials["event_ids"]):
        piece = SPLIT["ORD"].index(slot_of_token[int(token)])
        assert all(int(i) % 3 == piece for i in ids)
    assert not ord_partials.duplicated(["window_start_ms", "token"]).any()
    others = partials[partials["origin"] != "ORD"]
    assert all(slot_of_token[int(t)] == HOME[o] for o, t in zip(others["origin"], others["token"]))


def run_processor(partials: pd.DataFrame, watermarks: list[int]) -> pd.DataFrame:
    """Feed partials to the processor slot by slot, then close windows; returns `window` rows."""
    tester = TwsTester(KeyedWindowProcessor(FLIGHT_DELAYS, tuple(int(t) for t in TOKENS)), timeMode="EventTime", eventTimeExtractor=lambda row: 2**62)
    for token, rows in partials.groupby("token"):
        tester.testInPandas(int(token), rows.reset_index(drop=True))
    out = [tester.setWatermark(watermark) for watermark in watermarks]
    frames = [frame[frame["kind"] == "window"] for frame in out if "kind" in frame]
    return pd.concat(frames, ignore_index=True)


WINDOW_FIELDS = ["origin", "window_start_ms", "window_end_ms", "count", "sum_delay_min", "max_delay_min", "mean_delay_min", "alert"]


def sorted_windows(frame: pd.DataFrame) -> pd.DataFrame:
    return frame[WINDOW_FIELDS].sort_values(["origin", "window_start_ms"]).reset_index(drop=True).astype({"alert": bool})


@pytest.mark.parametrize("seed", [1, 2])
def test_merged_windows_of_a_split_key_equal_an_unsplit_run(seed):
    frame = events(2_000, seed)
    watermarks = [T0 + 2 * HOUR_MS, T0 + 6 * HOUR_MS]  # close some windows, then all
    split = run_processor(partials_of_flights(frame, token_of, TOKENS, HOUR_MS, {"ORD": TOKENS[list(SPLIT["ORD"])]}), watermarks)
    whole = run_processor(partials_of_flights(frame, token_of, TOKENS, HOUR_MS), watermarks)

    assert split["origin"].eq("ORD").sum() > whole["origin"].eq("ORD").sum()  # really emitted in pieces
    merged, folded = merge_split_windows(split, FLIGHT_DELAYS)
    assert folded == len(split) - len(merged) > 0
    pd.testing.assert_frame_equal(sorted_windows(merged), sorted_windows(whole))
    assert merged["count"].sum() == 2_000
    assert set(merged.loc[merged["origin"] == "ORD", "slot"]) == {min(SPLIT["ORD"])}


def test_merge_recomputes_mean_and_alert_and_leaves_unsplit_rows_alone():
    rows = pd.DataFrame(
        {
            "kind": "window",
            "origin": ["ORD", "ORD", "LGA"],
            "window_start_ms": [T0, T0, T0],
            "window_end_ms": [T0 + HOUR_MS] * 3,
            "count": [3, 2, 4],
            "sum_delay_min": [150, 0, 200],
            "max_delay_min": [60, 0, 90],
            "mean_delay_min": [50.0, 0.0, 50.0],
            "alert": [False, False, False],  # neither piece alerts alone (3 and 2 flights < 5)
            "slot": [5, 1, 2],
        }
    )
    merged, folded = merge_split_windows(rows, FLIGHT_DELAYS)
    assert folded == 1
    ord_row = merged[merged["origin"] == "ORD"].iloc[0]
    assert (ord_row["count"], ord_row["sum_delay_min"], ord_row["max_delay_min"], ord_row["slot"]) == (5, 150, 60, 1)
    assert ord_row["mean_delay_min"] == 30.0 and bool(ord_row["alert"])  # 5 flights, mean 30 -> alert
    lga = merged[merged["origin"] == "LGA"].iloc[0]
    assert (lga["count"], lga["slot"], bool(lga["alert"])) == (4, 2, False)
    unchanged, none = merge_split_windows(rows.iloc[2:], FLIGHT_DELAYS)
    assert none == 0 and unchanged is not None and len(unchanged) == 1
