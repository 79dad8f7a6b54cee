"""Re-keying migrated state: tokens, merges of split keys, timers, and restoring it."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from keyshift.errors import JobError
from keyshift.migration.state import rekey_state
from keyshift.processing.operators.state_variables import (
    EXPIRY_COLUMN, GROUPING_COLUMN, STATE_VAR_COLUMN, TIMER_VAR, MapStateVariable, initial_state_schema, restore_initial_state,
)
from keyshift.jobs.flight_delays import FLIGHT_DELAYS
from keyshift.processing.operators.processor import (
    CLOCK_STATE_NAME, PENDING_STATE_NAME, PENDING_VALUE_SCHEMA, pack_pending, pending_key_schema, state_variables, unpack_pending,
)

STATE_VARIABLES = state_variables(FLIGHT_DELAYS)
PENDING_KEY_SCHEMA = pending_key_schema(FLIGHT_DELAYS)
merge_pending_values = STATE_VARIABLES[0].merge

OLD_TOKENS = (10, 11, 12, 13)  # slot -> token of the old query (P = 4)
NEW_TOKENS = (20, 21)  # of the new one (P = 2)
H = 3_600_000


def pending(starts, counts, sums, maxes, ids, clock=None) -> tuple[bytes, bytes, bytes]:
    """A pending-windows value; `clock` a KeyClock (key/dynamic mode) or None."""
    return (pack_pending(np.array(starts), np.array(counts), np.array([sums, maxes])), np.array(ids, np.int64).tobytes(),
            clock.pack() if clock is not None else b"")


def state_frame(rows: list[tuple[int, str, tuple[bytes, bytes, bytes]]]) -> dict[str, pd.DataFrame]:
    return {PENDING_STATE_NAME: pd.DataFrame({
        "old_token": [t for t, _, _ in rows], "partition_id": [OLD_TOKENS.index(t) for t, _, _ in rows],
        "key": [k for _, k, _ in rows], "partials": [v[0] for _, _, v in rows], "event_ids": [v[1] for _, _, v in rows],
        "clock": [v[2] for _, _, v in rows],
    })}


def no_timers() -> pd.DataFrame:
    return pd.DataFrame({"old_token": pd.Series([], dtype=np.int64), EXPIRY_COLUMN: pd.Series([], dtype=np.int64)})


def test_each_key_gets_its_new_slots_token_and_moves_are_counted():
    state = state_frame([(10, "ORD", pending([0], [2], [5], [4], [1, 2])), (11, "ATL", pending([H], [1], [7], [7], [3]))])
    slots = {"ORD": 0, "ATL": 0}  # ORD was on slot 0 and stays; ATL was on slot 1 and moves
    migrated = rekey_state(state, no_timers(), STATE_VARIABLES, slots.__getitem__, NEW_TOKENS, OLD_TOKENS)
    rows = migrated.rows.set_index("key")
    assert rows.loc["ORD", GROUPING_COLUMN] == 20 and rows.loc["ATL", GROUPING_COLUMN] == 20
    assert migrated.keys_moved == 1 and migrated.keys_total == 2
    atl_bytes = len(state[PENDING_STATE_NAME]["partials"][1]) + len(state[PENDING_STATE_NAME]["event_ids"][1])
    assert migrated.state_bytes_moved == atl_bytes
    assert migrated.rows_read == {PENDING_STATE_NAME: 2, CLOCK_STATE_NAME: 0} and migrated.rows_written == {PENDING_STATE_NAME: 2, CLOCK_STATE_NAME: 0}
    assert list(migrated.rows.columns) == initial_state_schema(STATE_VARIABLES).fieldNames()
    assert set(migrated.rows[STATE_VAR_COLUMN]) == {PENDING_STATE_NAME}


def test_the_pieces_of_a_split_key_merge_into_one_row_with_every_event():
    state = state_frame([
        (10, "ORD", pending([0, H], [2, 1], [5, 9], [4, 9], [1, 2, 7])),
        (12, "ORD", pending([0, 2 * H], [1, 1], [6, 3], [6, 3], [4, 8])),
    ])
    migrated = rekey_state(state, no_timers(), STATE_VARIABLES, lambda key: 1, NEW_TOKENS, OLD_TOKENS)
    assert len(migrated.rows) == 1 and migrated.rows_written == {PENDING_STATE_NAME: 1, CLOCK_STATE_NAME: 0}
    starts, counts, (sums, maxes) = unpack_pending(migrated.rows["partials"][0], 2)
    assert starts.tolist() == [0, H, 2 * H] and counts.tolist() == [3, 1, 1]
    assert sums.tolist() == [11, 9, 3] and maxes.tolist() == [6, 9, 3]
    ids = np.frombuffer(migrated.rows["event_ids"][0], np.int64)
    assert sorted(ids[:3].tolist()) == [1, 2, 4] and ids[3:].tolist() == [7, 8]  # window by window


def test_a_key_on_several_slots_without_a_merge_is_an_error():
    variable = MapStateVariable(PENDING_STATE_NAME, PENDING_KEY_SCHEMA, PENDING_VALUE_SCHEMA, merge=None)
    state = state_frame([(10, "ORD", pending([0], [1], [1], [1], [1])), (11, "ORD", pending([0], [1], [1], [1], [2]))])
    with pytest.raises(JobError, match="ORD"):
        rekey_state(state, no_timers(), (variable,), lambda key: 0, NEW_TOKENS, OLD_TOKENS)


def test_timers_follow_the_keys_to_every_token_that_receives_one():
    state = state_frame([(10, "ORD", pending([0], [1], [1], [1], [1])), (10, "ATL", pending([0], [1], [1], [1], [2]))])
    timers = pd.DataFrame({"old_token": [10, 10, 13], EXPIRY_COLUMN: [H - 1, 2 * H - 1, 5 * H - 1]})
    slots = {"ORD": 0, "ATL": 1}
    migrated = rekey_state(state, timers, STATE_VARIABLES, slots.__getitem__, NEW_TOKENS, OLD_TOKENS)
    timer_rows = migrated.rows[migrated.rows[STATE_VAR_COLUMN] == TIMER_VAR]
    assert sorted(zip(timer_rows[GROUPING_COLUMN], timer_rows[EXPIRY_COLUMN])) == [
        (20, H - 1), (20, 2 * H - 1), (21, H - 1), (21, 2 * H - 1)]  # token 13 held no key: its timer has nothing to close
    assert migrated.timers_read == 3 and migrated.timers_written == 4


class FakeMapState:
    def __init__(self) -> None:
        self.values: dict[tuple, tuple] = {}

    def updateValue(self, key: tuple, value: tuple) -> None:
        self.values[key] = value


def test_restore_puts_state_and_timers_back():
    state = state_frame([(10, "ORD", pending([0], [2], [5], [4], [1, 2]))])
    timers = pd.DataFrame({"old_token": [10], EXPIRY_COLUMN: [H - 1]})
    migrated = rekey_state(state, timers, STATE_VARIABLES, lambda key: 1, NEW_TOKENS, OLD_TOKENS)
    fake, registered = FakeMapState(), []
    restore_initial_state(migrated.rows, {PENDING_STATE_NAME: fake}, registered.append, STATE_VARIABLES)
    assert registered == [H - 1]
    partials, ids, clock = fake.values[("ORD",)]
    assert unpack_pending(partials, 2)[1].tolist() == [2] and np.frombuffer(ids, np.int64).tolist() == [1, 2] and clock == b""


def test_merge_pending_values_of_one_piece_is_that_piece():
    value = pending([0, H], [2, 1], [5, 9], [4, 9], [1, 2, 7])
    assert merge_pending_values([value]) == value


def test_the_clocks_of_a_split_keys_pieces_merge_with_their_windows():
    """key mode: each piece's clock is in its pending value; the merged value's clock waits for
    the slowest piece (smallest max event time) and never reopens a window any piece closed."""
    from keyshift.eventtime.watermarks import KeyClock

    fast = pending([2 * H], [1], [3], [3], [8], KeyClock(2 * H + 50, 2 * H, 1_700_000_000_500, 60_000))
    slow = pending([H], [1], [9], [9], [7], KeyClock(H + 10, H, 1_700_000_000_000, 60_000))
    only_windows = pending([H], [1], [1], [1], [9])  # a piece whose clock was already freed
    partials, ids, clock = merge_pending_values([fast, slow, only_windows])
    assert unpack_pending(partials, 2)[1].tolist() == [2, 1] and np.frombuffer(ids, np.int64).tolist() == [7, 9, 8]
    assert KeyClock.unpack(clock) == KeyClock(H + 10, 2 * H, 1_700_000_000_500, 60_000)
    assert merge_pending_values([only_windows])[2] == b""  # no piece had a clock: none after the merge


def _switch(**fields):
    from keyshift.migration.switch_record import SwitchRecord

    return SwitchRecord(**{"switch_id": "sw", "run_id": "r", "topic": "t", "strategy_from": "hash", "strategy_to": "least_count",
                           "partitions_from": 3, "partitions_to": 3, "epoch_from": 0, "epoch_to": 1, **fields})


def test_keys_with_state_missing_from_the_plan_get_the_least_loaded_slots():
    from keyshift.migration.in_driver import complete_mapping, slot_function

    plan = {"ORD": 0, "ATL": 0, "DEN": 1}
    completed = complete_mapping(_switch(mapping=dict(plan)), {"ORD", "HDN", "EGE", "ATL"})
    assert completed.mapping["EGE"] == 2 and completed.mapping["HDN"] == 1  # slot 2 held none, then 1 and 2 tie -> 1
    assert completed.keys_added_to_plan == 2
    assert slot_function(completed)("HDN") == 1
    assert complete_mapping(_switch(strategy_to="hash", mapping=dict(plan)), {"HDN"}).mapping == plan  # the rule places every key


def test_a_key_the_new_query_placed_itself_is_expected_on_the_store_slot():
    from keyshift.migration.in_driver import slot_function
    from keyshift.placement.strategies import strategy_by_name

    record = _switch(mapping={"ORD": 0}, split={"ATL": [2, 1]})
    hashed = strategy_by_name("hash", 3).slot_of("PSG")
    placed = {"PSG": (hashed + 1) % 3, "ORD": 2, "ATL": 0}.get  # the store's record; plan and split win
    slot_of = slot_function(record, placed)
    assert slot_of("PSG") == (hashed + 1) % 3 and slot_of("ORD") == 0 and slot_of("ATL") == 2
    assert slot_of("EGE") == strategy_by_name("hash", 3).slot_of("EGE")  # placed nowhere: the rule
    assert slot_function(record)("PSG") == hashed


def test_windows_and_key_clocks_migrate_together_into_a_spark_initial_state(spark, tmp_path):
    """Both declared variables in one initial-state frame: each variable's longs are NULL in the
    other's rows, and Spark must still get longs (not floats) for the rows that have them."""
    from keyshift.eventtime.watermarks import KeyClock
    from keyshift.migration.state import save_migrated
    from keyshift.processing.operators.state_variables import initial_state_frame

    key_clock = KeyClock(H + 7, H, 1_700_000_000_000, 60_000)  # key mode: in ORD's pending value
    state = state_frame([(10, "ORD", pending([0], [2], [5], [4], [1, 2], key_clock))])
    clock = KeyClock(H + 5, H, 1_700_000_000_000, 60_000).as_value()  # nkey mode: a group's clock in its own map
    state[CLOCK_STATE_NAME] = pd.DataFrame({
        "old_token": [11], "partition_id": [1], "key": ["#3"],
        **{name: [clock[i]] for i, name in enumerate(["max_event_time_ms", "closed_through_ms", "last_seen_ms", "bound_ms", "recent"])},
    })
    migrated = rekey_state(state, no_timers(), STATE_VARIABLES, lambda key: 1, NEW_TOKENS, OLD_TOKENS)
    assert migrated.rows_written == {PENDING_STATE_NAME: 1, CLOCK_STATE_NAME: len(NEW_TOKENS)}  # the group clock on every slot
    assert migrated.keys_total == 1  # "#3" is a group, not a key
    path = save_migrated(migrated, tmp_path / "initial_state.parquet")
    grouped = initial_state_frame(spark, path, STATE_VARIABLES)  # grouped by token, as the new query takes it
    rows = grouped.applyInPandas(lambda frame: frame, initial_state_schema(STATE_VARIABLES)).toPandas()
    clocks = rows[rows[STATE_VAR_COLUMN] == CLOCK_STATE_NAME]
    assert sorted(clocks["key"]) == ["#3", "#3"] and set(clocks["max_event_time_ms"]) == {H + 5}
    windows = rows[rows[STATE_VAR_COLUMN] == PENDING_STATE_NAME]
    assert windows["key"].tolist() == ["ORD"] and KeyClock.unpack(windows["clock"].iloc[0]) == key_clock
