"""The batch channel on the real Redis: what the driver publishes, the tasks read, and back."""

from __future__ import annotations

import uuid

import pytest

from keyshift.errors import JobError
from keyshift.eventtime.batch_channel import BatchChannel
from keyshift.eventtime.partition_clocks import PartitionClock, PartitionClocks, SliceReport
from keyshift.eventtime.plausibility import BatchReference
from keyshift.names import redis_batch_context_key, redis_batch_reports_key

DAY = 86_400_000


@pytest.fixture
def channel(stack_settings):
    run_id = f"it-channel-{uuid.uuid4().hex[:6]}"
    channel = BatchChannel(stack_settings.redis_url, run_id)
    yield channel
    for key in channel.client.scan_iter(f"*:batch:{run_id}:*"):
        channel.client.delete(key)


def test_a_published_context_is_what_the_tasks_read(channel):
    clocks = PartitionClocks(batch_id=7, time_ms=1_795_000_000_000, idle_timeout_ms=60_000,
                             clocks={0: PartitionClock(5 * DAY, 1_794_999_999_000), 1: PartitionClock(None, 1_795_000_000_000)},
                             end_offsets={0: 100, 1: 50})
    channel.publish(7, clocks, BatchReference(4 * DAY, 1_795_000_000_000))
    read, reference = BatchChannel(channel.redis_url, channel.run_id).context(7)  # a task's own client
    assert read == clocks and reference == BatchReference(4 * DAY, 1_795_000_000_000)
    assert 0 < channel.client.ttl(redis_batch_context_key(channel.run_id, 7)) <= 7 * 86_400


def test_reports_are_kept_per_query_and_a_retry_replaces_its_task(channel):
    channel.report(7, "checkpoint-0", 0, {0: SliceReport(10, 5 * DAY)})
    channel.report(7, "checkpoint-0", 1, {1: SliceReport(3, None, True)})
    channel.report(7, "checkpoint-0", 0, {0: SliceReport(10, 5 * DAY)})  # Spark retried task 0: same offsets, same report
    channel.report(7, "checkpoint-1", 0, {0: SliceReport(99, 99 * DAY)})  # another query's (a switch's old query)
    assert channel.reports(7, "checkpoint-0") == [{0: SliceReport(10, 5 * DAY)}, {1: SliceReport(3, None, True)}]
    channel.forget(7, "checkpoint-0")
    assert channel.reports(7, "checkpoint-0") == []
    assert channel.client.exists(redis_batch_reports_key(channel.run_id, 7, "checkpoint-1"))


def test_a_batch_without_a_context_fails_naming_the_redis(channel):
    with pytest.raises(JobError, match="no context in Redis.*must reach the driver's Redis"):
        channel.context(3)
    channel.client.set(redis_batch_context_key(channel.run_id, 3), "{not json")
    with pytest.raises(JobError, match="not valid"):
        channel.context(3)
