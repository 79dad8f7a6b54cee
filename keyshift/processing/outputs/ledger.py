"""The run's counts, persisted per micro-batch so that they survive a crash of the driver.

The sink adds up what every micro-batch produced (windows, late events, dead letters, events per
slot). Kept only in the driver's memory, those counts die with it, while Spark resumes from its
checkpoint in the middle of the stream: the resumed run would reconcile against zero. So the sink
writes each batch's counts to `runs/<run_id>/batches/<batch_id>.json` before Spark commits the
batch, and the run's totals are the sum over those files:

- idempotent: a batch that Spark replays after a crash (it ran, but its commit did not reach the
  checkpoint) produces the same output and rewrites the same file, so it is never counted twice;
- atomic: written to a temporary file and renamed, so a kill mid-write leaves the old file or none.

Spark replays exactly the batches in its offset log without a commit, with the same offsets and
the same watermark, so the files of a resumed run are those of a run that never crashed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from keyshift.names import RunDir


@dataclass
class Counts:
    """What micro-batches produced (events, except `windows_emitted` in windows and
    `merged_window_pieces` in window rows of split keys folded into another slot's row)."""

    windows_emitted: int = 0
    sum_window_counts: int = 0
    alerts: int = 0
    late_events: int = 0
    dead_letters: int = 0
    filtered_events: int = 0
    merged_window_pieces: int = 0
    per_slot_events: list[int] = field(default_factory=list)
    dead_letters_by_reason: dict[str, int] = field(default_factory=dict)

    @property
    def processed_events(self) -> int:
        """Events the slots processed (Σ per-slot events)."""
        return sum(self.per_slot_events)

    @property
    def accounted_events(self) -> int:
        """Events the outputs account for: Σ window counts + late + dead letters + filtered
        (records a spec's `keep` rule left out)."""
        return self.sum_window_counts + self.late_events + self.dead_letters + self.filtered_events


@dataclass
class BatchCounts(Counts):
    """What one micro-batch produced; `batch_id` is Spark's."""

    batch_id: int = -1


@dataclass
class RunCounters(Counts):
    """Totals of one run over its micro-batches (`batches` of them)."""

    batches: int = 0

    def add(self, batch: BatchCounts) -> None:
        """Add one batch's counts; per-slot lists of different lengths (a switch changed P) add
        slot by slot, the shorter padded with zeros."""
        self.batches += 1
        self.windows_emitted += batch.windows_emitted
        self.sum_window_counts += batch.sum_window_counts
        self.alerts += batch.alerts
        self.late_events += batch.late_events
        self.dead_letters += batch.dead_letters
        self.filtered_events += batch.filtered_events
        self.merged_window_pieces += batch.merged_window_pieces
        # a switch may change P between batches of one run: the longer list sets the length
        width = max(len(self.per_slot_events), len(batch.per_slot_events))
        mine = self.per_slot_events + [0] * (width - len(self.per_slot_events))
        theirs = list(batch.per_slot_events) + [0] * (width - len(batch.per_slot_events))
        self.per_slot_events = [a + b for a, b in zip(mine, theirs)]
        for reason, count in batch.dead_letters_by_reason.items():
            self.dead_letters_by_reason[reason] = self.dead_letters_by_reason.get(reason, 0) + count


def run_totals(batches: Iterable[BatchCounts], partitions: int) -> RunCounters:
    """The sum of `batches`; `per_slot_events` has max(P = `partitions`, the longest batch's) entries
    (a run whose switch changed P has batches of both widths)."""
    counters = RunCounters(per_slot_events=[0] * partitions)
    for batch in batches:
        counters.add(batch)
    return counters


class RunLedger:
    """The per-batch counts of one run in `run_dir/batches/` (see the module docstring).

    Args:
        run_dir: `runs/<run_id>/`.
    """

    def __init__(self, run_dir: Path) -> None:
        self.dir = RunDir(Path(run_dir)).ledger
        self.dir.mkdir(parents=True, exist_ok=True)

    def path(self, batch_id: int) -> Path:
        """The file of batch `batch_id`."""
        return self.dir / f"{batch_id:08d}.json"

    def record(self, counts: BatchCounts) -> None:
        """Write (or rewrite, for a replayed batch) one batch's counts, atomically."""
        final = self.path(counts.batch_id)
        partial = final.with_suffix(".tmp")
        partial.write_text(json.dumps(asdict(counts), sort_keys=True))
        partial.replace(final)

    def batches(self) -> list[BatchCounts]:
        """Every recorded batch, by batch id."""
        return [BatchCounts(**json.loads(path.read_text())) for path in sorted(self.dir.glob("*.json"))]

    def totals(self, partitions: int) -> RunCounters:
        """The run's totals: the sum over every recorded batch (`run_totals`)."""
        return run_totals(self.batches(), partitions)
