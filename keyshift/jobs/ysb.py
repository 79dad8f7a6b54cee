"""The Yahoo Streaming Benchmark (YSB) job: views per campaign per 10-second event-time window.

A record is one ad event of the generator (`keyshift.data.ysb`), Kafka key = the ad's campaign:
`{"event_id": 0, "user_id": "<uuid>", "page_id": "<uuid>", "ad_id": "<uuid>", "ad_type":
"banner", "event_type": "view", "event_time": 1764000000000, "ip_address": "1.2.3.4"}` (event
time in epoch ms UTC). As the published benchmark's jobs: keep the `view` events (the others are
counted as filtered), project `ad_id` and the event time, join each ad to its campaign through
the ad -> campaign map in Redis (`keyshift.names.redis_ysb_ad_campaign_key(topic)`, cached per
executor, reloaded when its version changes; an ad not in it is a dead letter `unknown ad_id`, a
Kafka key other than the ad's campaign a dead letter `key does not match campaign_id`), count the
views per campaign and 10-second tumbling window, and write each final window's count and
update time to Redis as the published jobs do (`keyshift.processing.outputs.redis_windows`) besides the
windows table `campaign_id, window_start, window_end, count, slot, epoch`. No alerts.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from keyshift.eventtime.windows import YSB_WINDOW_MS as WINDOW_MS
from keyshift.names import (
    YSB_DEAD_LETTER_TOPIC,
    YSB_LATE_TOPIC,
    YSB_TOPIC,
    redis_ysb_ad_campaign_key,
    redis_ysb_ad_campaign_version_key,
)
from keyshift.jobs.spec import JobSpec, JobTopics, Keep, KeyLookup, RecordField


def no_outputs(counts: np.ndarray, aggregates: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The output rule: a YSB window publishes its count only (no derived column)."""
    return {}


YSB = JobSpec(
    name="ysb",
    fields=(  # the generator's JSON order, so its records take the canonical fast path
        RecordField("event_id", "long", non_negative=True),
        RecordField("user_id", "string"),
        RecordField("page_id", "string"),
        RecordField("ad_id", "string", non_empty=True),
        RecordField("ad_type", "string"),
        RecordField("event_type", "string", non_empty=True),
        RecordField("event_time", "long", column="event_time_ms", non_negative=True),
        RecordField("ip_address", "string"),
    ),
    key="campaign_id",
    aggregates=(),
    outputs={},
    derive=no_outputs,
    table_columns=("count",),
    topics=JobTopics(input=YSB_TOPIC, alerts=None, late=YSB_LATE_TOPIC, dead_letter=YSB_DEAD_LETTER_TOPIC),
    window_ms=WINDOW_MS,
    keep=Keep("event_type", ("view",)),
    key_lookup=KeyLookup("ad_id", redis_ysb_ad_campaign_key, redis_ysb_ad_campaign_version_key),
    carry=("ad_id",),
    redis_windows=True,
)
"""The YSB job's spec."""
