"""Helpers of the integration tests that run the YSB job: a fresh topic with the job's side-output
topics, the generator run through its CLI, and the clean-up of the topic's and the run's keys."""

from __future__ import annotations

import uuid

from click.testing import CliRunner

from keyshift.cli.replay import command as replay_command
from keyshift.names import (
    YSB_DEAD_LETTER_TOPIC,
    YSB_LATE_TOPIC,
    redis_replay_key,
    redis_ysb_ad_campaign_key,
    redis_ysb_ad_campaign_version_key,
    redis_ysb_campaigns_key,
)
from keyshift.topics import create_topics, delete_topics, describe_topics


def fresh_ysb_topic(settings, label: str, partitions: int) -> str:
    """A new input topic `it-<label>-<hex>` of `partitions` partitions; the YSB dead-letter and late
    topics are created too when missing. Returns the topic's name."""
    topic = f"it-{label}-{uuid.uuid4().hex[:8]}"
    create_topics(settings, [topic], partitions)
    missing = [t for t in (YSB_DEAD_LETTER_TOPIC, YSB_LATE_TOPIC) if t not in describe_topics(settings, [t])]
    if missing:
        create_topics(settings, missing, partitions)
    return topic


def generate(topic: str, partitions: int, *options: str) -> None:
    """`keyshift replay ysb --topic TOPIC --partitions P --no-progress OPTIONS...` in this process;
    fails the test with the command's output when it exits non-zero."""
    outcome = CliRunner().invoke(replay_command, ["ysb", "--topic", topic, "--partitions", str(partitions), "--no-progress", *options])
    assert outcome.exit_code == 0, outcome.output


def remove_ysb_run(settings, client, topic: str, run_id: str) -> None:
    """Delete the topic, its YSB map and replay record, and the run's Redis windows."""
    delete_topics(settings, [topic])
    client.delete(redis_replay_key(topic), redis_ysb_ad_campaign_key(topic), redis_ysb_campaigns_key(topic),
                  redis_ysb_ad_campaign_version_key(topic))
    keys = list(client.scan_iter(f"*:ysb:run:{run_id}:*"))
    if keys:
        client.delete(*keys)
