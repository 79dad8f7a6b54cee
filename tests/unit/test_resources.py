"""The resource sampler counts CPU seconds per role of a real process tree."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import psutil

from keyshift.runtime.resources import CpuSeconds, ResourceSampler, events_per_cpu_second

# A stand-in "JVM": waits for a line on stdin, burns CPU itself, starts a child that burns CPU
# (a "Python worker"), waits for it, then waits for stdin to close.
TREE = textwrap.dedent(
    """
    import subprocess, sys, time
    sys.stdin.readline()
    def burn(seconds):
        end = time.process_time() + seconds
        while time.process_time() < end:
            pass
    burn(0.6)
    child = subprocess.Popen([sys.executable, "-c",
        "import time\\nend = time.process_time() + 0.6\\nwhile time.process_time() < end: pass\\nimport sys; sys.stdin.read()"],
        stdin=subprocess.PIPE)
    print("child", flush=True)
    sys.stdin.readline()
    child.stdin.close(); child.wait()
    """
)


def test_cpu_is_counted_per_role_from_the_sampler_start():
    tree = subprocess.Popen([sys.executable, "-c", TREE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        sampler = ResourceSampler(tree.pid, interval_s=0.05, driver_pid=tree.pid)  # baseline: start-up CPU excluded
        sampler.start()
        tree.stdin.write("go\n")
        tree.stdin.flush()
        assert tree.stdout.readline().strip() == "child"
        # let the child burn its CPU while sampled
        for _ in range(200):
            sampler.sample()
            if sampler.cpu_seconds().python_workers >= 0.55:
                break
            time.sleep(0.02)
        sampler.stop()
        cpu = sampler.cpu_seconds()
    finally:
        tree.stdin.write("done\n")
        tree.stdin.close()
        tree.wait(timeout=30)
    assert 0.55 <= cpu.jvm < 2.0
    assert 0.55 <= cpu.python_workers < 2.0
    assert cpu.driver_python == 0.0  # the driver is the "JVM" itself here: counted once, as jvm
    assert sampler.peak_rss_bytes > 0 and sampler.peak_children_rss_bytes > 0
    assert cpu.as_dict()["total"] == round(cpu.jvm + cpu.python_workers, 2)


def test_only_python_descendants_are_python_workers():
    # a stand-in "JVM" whose only child is a command (as Hadoop's local file system runs them)
    tree = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; subprocess.run(['sleep', '1']); sys.stdin.read()"],
                            stdin=subprocess.PIPE, text=True)
    try:
        sampler = ResourceSampler(tree.pid, interval_s=0.05, driver_pid=tree.pid)
        for _ in range(10):
            sampler.sample()
            time.sleep(0.05)
        assert any(child.name() == "sleep" for child in psutil.Process(tree.pid).children())
        sampler.stop()
    finally:
        tree.stdin.close()
        tree.wait(timeout=30)
    assert sampler.peak_children_rss_bytes == 0
    assert sampler.cpu_seconds().python_workers == 0.0
    assert sampler.peak_rss_bytes > 0


def test_events_per_cpu_second():
    assert events_per_cpu_second(1000, CpuSeconds(jvm=1.5, python_workers=0.4, driver_python=0.1)) == 500.0
    assert events_per_cpu_second(1000, CpuSeconds(0.0, 0.0, 0.0)) is None
