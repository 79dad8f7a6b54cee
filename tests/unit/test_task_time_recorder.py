"""TaskTimeRecorder: a switch's new query is followed without reading Spark's REST API then
(that read competed with the new query's first batch, inside the pause); the query it leaves
is read at the next refresh."""

from types import SimpleNamespace

from keyshift.monitoring.spark_tasks import KeyedStageTaskSeconds
from keyshift.runtime import run_summary


def test_follow_defers_the_old_querys_last_read_to_the_next_refresh(tmp_path, monkeypatch):
    reads = []

    def stages(ui, app, name, partitions, skip=frozenset(), stateful_partitions=None, source_tasks=None):
        reads.append(name)
        return KeyedStageTaskSeconds(source={len(skip): [1.0] * partitions}, stateful={len(skip): [2.0]})

    monkeypatch.setattr(run_summary, "keyed_stage_task_seconds", stages)
    spark = SimpleNamespace(sparkContext=SimpleNamespace(uiWebUrl="http://127.0.0.1:4040", applicationId="local-1"))
    recorder = run_summary.TaskTimeRecorder(spark, tmp_path)
    recorder.follow("q0", 0, 2)
    recorder.follow("q1", 10, 2)  # a switch: nothing is read now
    assert reads == []
    recorder.refresh()
    assert reads == ["q0", "q1"]
    recorder.refresh()
    assert reads == ["q0", "q1", "q1"]  # the old query is read once more, then left
    assert set(recorder.times["stateful"]) == {"0", "10", "11"}
