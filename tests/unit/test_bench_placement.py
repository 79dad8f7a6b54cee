"""The placement benchmark: streams, splits, per-slot loads, the report's shape (no flights needed)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from keyshift.bench.placement import (
    check_targets,
    partitioner_throughput,
    run_placement_bench,
    score,
    synthetic_stream,
    synthetic_streams,
)
from keyshift.placement.evaluation import (
    MODES,
    VARIANTS,
    KeyedStream,
    Variant,
    build_strategy,
    keyed_stream,
    slot_loads,
    split_stream,
)
from keyshift.errors import ConfigurationError


def hand_stream() -> KeyedStream:
    # 10 events: a a b a c a b a d a -> a = 6, b = 2, c = 1, d = 1; codes by first appearance
    return keyed_stream("hand", "key", list("aabacabada"))


def test_keyed_stream_codes_follow_first_appearance() -> None:
    stream = keyed_stream("hand", "key", ["x", "y", "x", "z", "y"])
    assert stream.keys == ("x", "y", "z")
    assert stream.codes.tolist() == [0, 1, 0, 2, 1]
    assert stream.events == 5
    assert not stream.integer_keys
    assert keyed_stream("ints", "key", [3, -1, 3]).integer_keys


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ([], "has no events"),  # nothing to place
        (["a", None, "b"], "events without a key"),  # a missing key
    ],
)
def test_keyed_stream_refuses(values: list, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        keyed_stream("bad", "key", np.array(values, dtype=object))


@pytest.mark.parametrize(
    ("mode", "learn", "scored", "before"),
    [
        ("whole", [6, 2, 1, 1], [6, 2, 1, 1], [0, 0, 0, 0]),  # learn and score everything
        ("online", [1, 0, 0, 0], [5, 2, 1, 1], [1, 0, 0, 0]),  # first 10 % = the first event (a)
    ],
)
def test_split_stream(mode: str, learn: list[int], scored: list[int], before: list[int]) -> None:
    split = split_stream(hand_stream(), mode)
    assert (split.learn.tolist(), split.scored.tolist(), split.before.tolist()) == (learn, scored, before)


@pytest.mark.parametrize(
    ("mode", "share", "message"),
    [
        ("batch", 0.1, "unknown mode 'batch'"),  # not a mode
        ("online", 0.0, "train share must be in"),  # learns nothing
        ("online", 1.0, "train share must be in"),  # scores nothing
    ],
)
def test_split_stream_refuses(mode: str, share: float, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        split_stream(hand_stream(), mode, share)


@pytest.mark.parametrize(
    ("variant", "mode", "loads", "new_keys", "split_keys"),
    [
        # LPT: a (6) | b (2), c (1), d (1)
        (Variant("least_count"), "whole", [6, 4], 0, 0),
        # arrival order a, b, c, d: slots 0, 1, 0, 1 -> a + c | b + d
        (Variant("least_key"), "whole", [7, 3], 0, 0),
        # a = 6 of 10 > 1/2: pieces 3 + 3 on both slots, then b, c, d by LPT
        (Variant("hot_split"), "whole", [5, 5], 0, 1),
        # online: learned a only (slot 0); b, c, d come later, one event each: b -> 1, c -> 0 (tie), d -> 1
        (Variant("least_count"), "online", [6, 3], 3, 0),
        # online hot_split learned a from one event: hot, but one event makes one piece, so not split
        (Variant("hot_split"), "online", [6, 3], 3, 0),
    ],
)
def test_slot_loads_on_a_hand_made_stream(variant, mode, loads, new_keys, split_keys) -> None:
    stream = hand_stream()
    split = split_stream(stream, mode)
    strategy = build_strategy(variant, 2, stream, split.learn)
    got, extra = slot_loads(strategy, stream, split)
    assert got.tolist() == loads
    assert extra == {"new_keys": new_keys, "split_keys": split_keys}


def test_hot_split_loads_equal_an_event_by_event_replay() -> None:
    stream = synthetic_stream(1.2, 5_000, 40, seed=3)
    for mode in MODES:
        split = split_stream(stream, mode)
        strategy = build_strategy(Variant("hot_split"), 4, stream, split.learn)
        loads, _ = slot_loads(strategy, stream, split)
        start = stream.events - int(split.scored.sum())
        sequence = np.zeros(len(stream.keys), dtype=np.int64)
        replay = np.zeros(4, dtype=np.int64)
        for index, code in enumerate(stream.codes.tolist()):  # per event, on purpose: the reference
            if index >= start:
                replay[strategy.slot_for_event(stream.keys[code], int(sequence[code]))] += 1
            sequence[code] += 1
        assert loads.tolist() == replay.tolist()


def test_score_skips_modulo_for_non_integer_keys() -> None:
    stream = hand_stream()
    assert score(stream, 2, Variant("modulo"), split_stream(stream, "whole")) is None


@pytest.mark.parametrize(
    ("exponent", "message"),
    [
        (0.0, "Zipf exponent must be > 0"),  # s = 0 is the uniform control: pass None
        (-1.0, "Zipf exponent must be > 0"),  # negative exponent
    ],
)
def test_synthetic_stream_refuses(exponent: float, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        synthetic_stream(exponent, 10, 5, seed=0)


def test_synthetic_streams_are_seeded_and_skewed() -> None:
    first, second = synthetic_streams(20_000, 100, seed=1), synthetic_streams(20_000, 100, seed=1)
    assert [s.dataset for s in first] == ["zipf-0.8", "zipf-1.0", "zipf-1.2", "uniform"]
    assert all(np.array_equal(a.codes, b.codes) and a.keys == b.keys for a, b in zip(first, second))
    top_share = [np.bincount(s.codes).max() / s.events for s in first]
    assert top_share[0] < top_share[1] < top_share[2]  # more skew with a larger s
    assert top_share[3] < 0.03  # uniform over 100 keys: about 1 % each
    assert all(s.integer_keys for s in first)


def test_partitioner_throughput_reports_its_method() -> None:
    result = partitioner_throughput(["ORD", "ATL", "ORD", "DFW"] * 500, partitions=4, repeats=1)
    assert result["records"] == 2000
    assert result["ratio"] > 0
    assert "without a broker" in result["method"]
    with pytest.raises(ConfigurationError, match="need records"):
        partitioner_throughput([], partitions=4)


def test_check_targets_without_flights_reports_none() -> None:
    results = check_targets([], throughput_ratio=1.2)
    assert [r["met"] for r in results] == [None, None, None, True]


def test_bench_smoke_writes_json_and_png(tmp_path) -> None:
    streams = [synthetic_stream(1.0, 20_000, 60, seed=0), synthetic_stream(None, 20_000, 60, seed=1)]
    out = tmp_path / "bench" / "placement.json"
    report = run_placement_bench(streams, out, partitions=(2, 4), progress=False, throughput_keys=["1", "2", "3"] * 100)
    written = json.loads(out.read_text())
    assert written == json.loads(json.dumps(report))
    assert set(written) >= {"rows", "partitioner_throughput_ratio", "partitioner_throughput", "targets"}
    assert isinstance(written["partitioner_throughput_ratio"], float)
    rows = written["rows"]
    assert len(rows) == len(streams) * len(MODES) * 2 * len(VARIANTS)  # integer keys: modulo included
    for row in rows:
        assert row["dataset"] in {"zipf-1.0", "uniform"} and row["key"] == "key" and row["mode"] in MODES
        assert 0.0 <= row["balance_degree"] <= 1.0
        assert row["max_over_mean"] == pytest.approx(1.0 + row["extra_compute_time"])
        assert len(row["loads"]) == row["partitions"] and sum(row["loads"]) == row["events"]
        assert row["keys"] >= 1
    assert out.with_suffix(".png").stat().st_size > 0
    assert written["plot"] == str(out.with_suffix(".png"))


def test_cli_bench_placement_without_flights(tmp_path) -> None:
    from click.testing import CliRunner

    from keyshift.cli import _register, cli

    _register()
    out = tmp_path / "placement.json"
    args = ["bench", "placement", "--out", str(out), "--no-flights", "--no-broker", "--events", "5000", "--keys", "30", "-p", "2", "--no-progress"]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "flights/origin P=8 least_count online: balance degree >= 0.95: n/a (not measured)" in result.output
    assert len(json.loads(out.read_text())["rows"]) == 4 * len(MODES) * 1 * len(VARIANTS)


def test_broker_reachable_is_false_on_a_closed_port() -> None:
    import socket

    from keyshift.bench.placement import broker_reachable
    from keyshift.settings import Settings

    with socket.socket() as probe:  # a port that was free a moment ago and has no listener
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert broker_reachable(Settings(kafka_port=port), timeout_s=0.5) is False
