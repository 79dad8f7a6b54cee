"""Two switches of one run never overlap: the Redis lock and its clear error (real Redis)."""

from __future__ import annotations

import socket
import subprocess
import sys
import uuid

import pytest

from keyshift.errors import JobError

pytestmark = pytest.mark.integration


def test_a_second_switch_gets_a_clear_error_and_a_dead_holder_is_taken_over(stack_settings):
    from keyshift.migration.switch import SwitchControl
    from keyshift.migration.switch_record import SwitchRecord

    run_id = f"it-lock-{uuid.uuid4().hex[:8]}"
    control = SwitchControl.from_settings(stack_settings, run_id)
    try:
        control.save(SwitchRecord(switch_id="sw-first", run_id=run_id, topic="flights", strategy_from="hash", strategy_to="least_count",
                                  partitions_from=8, partitions_to=8, epoch_from=0, epoch_to=1, state="running", step="migrated"))
        mine = f"{socket.gethostname()}:{subprocess.os.getpid()}:a"
        control.acquire(mine)
        with pytest.raises(JobError, match=r"another switch of run .* is in progress \(switch sw-first to least_count, step migrated\)"):
            control.acquire(f"{socket.gethostname()}:{subprocess.os.getpid()}:b")
        control.release(mine)
        # a holder that died (a pid that no longer runs) does not block the next switch for 15 minutes
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        control.client.set(control.lock_key, f"{socket.gethostname()}:{dead.pid}:c", ex=900)
        control.acquire(mine)
        assert control.client.get(control.lock_key) == mine
    finally:
        control.client.delete(control.lock_key, control.record_key, control.history_key)
