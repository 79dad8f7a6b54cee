"""The switch record's typed form (`keyshift.migration.switch_record.SwitchRecord`)."""

from __future__ import annotations

import json

import pytest

from keyshift.errors import ConfigurationError
from keyshift.migration.switch_record import SwitchRecord


def _requested() -> SwitchRecord:
    return SwitchRecord(switch_id="sw-1", run_id="r1", topic="flights", strategy_from="hash", strategy_to="hot_split",
                        partitions_from=8, partitions_to=12, epoch_from=0, epoch_to=1, mapping={"ORD": 3},
                        split={"ATL": [1, 5]}, reason="threshold")


def test_a_record_round_trips_through_its_stored_json_and_ignores_unknown_keys():
    record = _requested().update(step="stopped", state="running", cut_batch=4, cut_offsets={"0": 17}, batch_base=5)
    record.step_seconds["stopped"] = 0.42
    stored = json.loads(json.dumps(record.as_json()))
    assert SwitchRecord.from_json({**stored, "from_a_later_version": 1}) == record
    assert record.split_slots == {"ATL": (1, 5)} and not record.rule_strategy and record.split_from_slots == {}


def test_a_name_that_is_not_a_field_is_refused_and_a_record_without_its_request_is_malformed():
    with pytest.raises(ValueError, match=r"not fields of a switch record: \['pause_second'\]"):
        _requested().update(pause_second=1.0)
    with pytest.raises(ConfigurationError, match="lacks a field"):
        SwitchRecord.from_json({"switch_id": "sw-1", "state": "running"})
