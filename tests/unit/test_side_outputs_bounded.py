"""Bounded transactional calls of the side-output sink (pure logic; a small fake producer stands
in for kafka-python's, whose calls can hang after a broker restart)."""

import threading
import time

import pytest
from kafka.errors import KafkaTimeoutError

from keyshift.processing.outputs import side_outputs
from keyshift.processing.outputs.side_outputs import TransactionalSideOutputs, bounded_call


def test_bounded_call_returns_raises_or_times_out():
    bounded_call(lambda: None, "nothing", 1.0)
    with pytest.raises(ValueError, match="boom"):
        bounded_call(lambda: (_ for _ in ()).throw(ValueError("boom")), "raising", 1.0)
    started = time.monotonic()
    with pytest.raises(KafkaTimeoutError, match="hanging did not finish"):
        bounded_call(lambda: threading.Event().wait(5), "hanging", 0.2)
    assert time.monotonic() - started < 2


class FakeProducer:
    """Records what a transaction did; `hang` makes send_offsets_to_transaction never answer."""

    def __init__(self, hang: bool):
        self.hang, self.sent, self.events, self.closed = hang, [], [], False

    def begin_transaction(self):
        self.events.append("begin")

    def send(self, topic, key=None, value=None):
        self.sent.append((topic, key, value))

    def send_offsets_to_transaction(self, offsets, group):
        if self.hang:
            threading.Event().wait(30)
        self.events.append(("offsets", next(iter(offsets.values())).offset, group))

    def commit_transaction(self):
        self.events.append("commit")

    def abort_transaction(self):
        self.events.append("abort")

    def close(self, timeout=None):
        self.closed = True


def _sink(producers, monkeypatch, committed_in_kafka=-1):
    monkeypatch.setattr(side_outputs, "last_committed_batch", lambda *args: committed_in_kafka)
    sink = TransactionalSideOutputs.__new__(TransactionalSideOutputs)
    sink.run_id, sink.last_committed_batch, sink.call_timeout_s = "r1", -1, 0.2
    sink._bootstrap_servers, sink._client_options = "127.0.0.1:9", {}
    made = iter(producers)
    sink._new_producer = lambda: next(made)
    sink._producer = sink._new_producer()
    return sink


def test_a_hung_offsets_call_is_abandoned_and_the_batch_sent_again_by_a_new_producer(monkeypatch):
    hung, fresh = FakeProducer(hang=True), FakeProducer(hang=False)
    sink = _sink([hung, fresh], monkeypatch)
    records = [("late", b"k", b"v1"), ("dead", None, b"v2")]
    assert sink.send_batch(3, iter(records)) is True
    assert hung.closed and hung.events == ["begin"]  # never committed: the new producer's fencing aborts it
    assert fresh.sent == records
    assert fresh.events == ["begin", ("offsets", 4, "keyshift-sink-r1"), "commit"]
    assert sink.last_committed_batch == 3


def test_the_batch_fails_after_the_last_attempt(monkeypatch):
    monkeypatch.setattr(side_outputs, "TRANSACTION_ATTEMPTS", 2)
    sink = _sink([FakeProducer(hang=True), FakeProducer(hang=True)], monkeypatch)
    with pytest.raises(KafkaTimeoutError):
        sink.send_batch(0, [("late", b"k", b"v")])
    assert sink.last_committed_batch == -1


def test_a_timed_out_commit_that_went_through_is_not_sent_again(monkeypatch):
    class SlowCommit(FakeProducer):
        def commit_transaction(self):
            threading.Event().wait(30)

    slow, fresh = SlowCommit(hang=False), FakeProducer(hang=False)
    sink = _sink([slow, fresh], monkeypatch, committed_in_kafka=5)  # the broker had committed batch 5
    assert sink.send_batch(5, [("late", b"k", b"v")]) is True
    assert fresh.sent == [] and fresh.events == []
    assert sink.last_committed_batch == 5


def test_a_refused_transaction_is_aborted_and_reported(monkeypatch):
    class Refusing(FakeProducer):
        def commit_transaction(self):
            raise RuntimeError("refused")

    producer = Refusing(hang=False)
    sink = _sink([producer], monkeypatch)
    with pytest.raises(RuntimeError, match="refused"):
        sink.send_batch(0, [])
    assert producer.events[-1] == "abort" and sink.last_committed_batch == -1
