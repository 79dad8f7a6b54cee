"""What a Spark job costs the machine: peak resident memory and CPU seconds, by process role.

A local Spark job is a process tree: the driver JVM (Spark's own work: Kafka reads, JSON
parsing, shuffles, state stores, planning), the Python workers it forks (pyspark's daemon and the
workers running `mapInArrow` and `transformWithStateInPandas` code) and the Python process that
started the JVM (pyspark's driver side: the sink's `foreachBatch`, progress handling). Under
spark-submit the JVM starts first and that Python process is its child.

Wall seconds measure a job only on a quiet machine; on a shared 2-core machine two runs of one
job differ by more than the jobs being compared. CPU seconds (user + system, from
`/proc/<pid>/stat` via psutil) count the work itself, so they rank two jobs even while other
processes run, and their split by role says where the work goes. `events_per_cpu_second` =
events / total CPU seconds is the noise-robust throughput figure the benches report beside
events per wall second.

How CPU is counted. The sampler reads every process of the tree every `interval_s` seconds and
keeps, per pid, the CPU time at the first and at the last read. A process that existed when the
sampler started counts from that first read; one started later counts from zero (its whole
life). A process that ends between two reads loses at most `interval_s` of CPU (its last read
stands); CPU time of exited children that a parent collected (`children_user`) is not added, so
nothing is counted twice. So the figure is a slight undercount, by at most `interval_s` CPU
seconds per process that ended during the run (pyspark reuses its Python workers, so few do).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

import psutil

ROLES = ("jvm", "python_workers", "driver_python")
"""Process roles: the driver JVM, its Python descendants other than the driver's Python process,
and the Python process that runs the job's driver code."""


@dataclass(frozen=True)
class CpuSeconds:
    """CPU seconds (user + system) a job's processes used while sampled.

    Attributes:
        jvm: the driver JVM's. python_workers: the JVM's descendants' (pyspark daemon, workers),
            except the driver's Python process. driver_python: the Python process that runs the
            job's driver code (`os.getpid()` of the sampler's creator).
    """

    jvm: float
    python_workers: float
    driver_python: float

    @property
    def total(self) -> float:
        """All roles' CPU seconds."""
        return self.jvm + self.python_workers + self.driver_python

    def as_dict(self) -> dict[str, float]:
        """`{"jvm", "python_workers", "driver_python", "total"}`, seconds rounded to 0.01."""
        return {"jvm": round(self.jvm, 2), "python_workers": round(self.python_workers, 2),
                "driver_python": round(self.driver_python, 2), "total": round(self.total, 2)}


def events_per_cpu_second(events: int, cpu: CpuSeconds) -> float | None:
    """`events / cpu.total` (events per CPU second), rounded to 0.1; None without CPU time."""
    return round(events / cpu.total, 1) if cpu.total > 0 else None


def _is_python(process: psutil.Process) -> bool:
    """Whether `process` is a Python interpreter (a pyspark daemon or worker), by its name."""
    try:
        return process.name().startswith("python")
    except psutil.Error:
        return False


class ResourceSampler(threading.Thread):
    """Samples a Spark job's process tree until stopped: peak resident memory and CPU seconds.

    Args:
        pid: the driver JVM's pid; its descendants are the Python workers.
        interval_s: seconds between samples (also the most CPU a process ending between two
            samples can go uncounted, see the module docstring).
        driver_pid: the Python process running the job's driver code (default: this one).

    Attributes:
        peak_rss_bytes: the JVM's largest resident set seen (bytes).
        peak_children_rss_bytes: the largest sum of its Python descendants' resident sets seen
            (bytes), the driver's Python process excluded. Other descendants (the shell commands
            Hadoop's local file system runs, e.g. to set a checkpoint file's permissions) count
            as the JVM's CPU and not here: runs of the plain job, which starts no Python, showed
            1.8-2.2 GB of "Python workers" in half of them. Watched every 20 ms, a plain job's
            JVM runs `chmod` and `readlink` through `jspawnhelper`, and between fork and exec
            the child, named after the forking thread (`stream executio`), reports 0.5-1.1 GB:
            the JVM's own memory.
    """

    def __init__(self, pid: int, interval_s: float = 0.5, driver_pid: int | None = None) -> None:
        super().__init__(daemon=True, name="job-resources")
        self._process = psutil.Process(pid)
        self._driver_pid = os.getpid() if driver_pid is None else driver_pid
        self._interval_s = interval_s
        self._stop_event = threading.Event()
        self._started_at = time.time()
        self._lock = threading.Lock()
        self._first: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._role: dict[int, str] = {}
        self.peak_rss_bytes = 0
        self.peak_children_rss_bytes = 0
        self.sample()  # the baseline of processes already running

    def _read(self, process: psutil.Process, role: str) -> int:
        """Record one process's CPU time; return its resident memory (bytes), 0 if it is gone."""
        try:
            with process.oneshot():
                times = process.cpu_times()
                rss = process.memory_info().rss
                created = process.create_time()
        except psutil.Error:
            return 0
        cpu = times.user + times.system
        with self._lock:
            if process.pid not in self._first:
                # started after the sampler: its whole life counts; else from this first read on
                self._first[process.pid] = 0.0 if created >= self._started_at else cpu
                self._role[process.pid] = role
            self._last[process.pid] = cpu
        return rss

    def sample(self) -> None:
        """Read the tree once (the thread calls this every `interval_s`)."""
        self.peak_rss_bytes = max(self.peak_rss_bytes, self._read(self._process, "jvm"))
        try:
            children = self._process.children(recursive=True)
        except psutil.Error:
            children = []
        workers = 0
        for child in children:
            if child.pid == self._driver_pid:
                continue
            if _is_python(child):
                workers += self._read(child, "python_workers")
            else:  # a command the JVM runs; between its fork and exec it shows the JVM's memory
                self._read(child, "jvm")
        self.peak_children_rss_bytes = max(self.peak_children_rss_bytes, workers)
        if self._driver_pid != self._process.pid:
            self._read(psutil.Process(self._driver_pid), "driver_python")

    def run(self) -> None:
        """The sampling thread: read the processes' CPU and memory every interval until stopped."""
        while not self._stop_event.wait(self._interval_s):
            if not self._process.is_running():
                return
            self.sample()

    def stop(self) -> None:
        """Stop sampling after one last read (the figures stay readable)."""
        self._stop_event.set()
        if self._process.is_running():
            self.sample()

    def cpu_seconds(self) -> CpuSeconds:
        """CPU seconds per role since the sampler started (see the module docstring)."""
        totals = dict.fromkeys(ROLES, 0.0)
        with self._lock:
            for pid, last in self._last.items():
                totals[self._role[pid]] += max(0.0, last - self._first[pid])
        return CpuSeconds(**totals)
