"""The queue-time scenario's CPU placement (``pinned_apart``): the measuring process on one CPU,
every thread of each executor's Manager process on another, and this process's CPUs given back."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from fenced_k8s_lab.bench.env import pinned_apart

THREADED = ("import threading, time; threading.Thread(target=time.sleep, args=(60,), daemon=True).start();"
            " time.sleep(60)")


def _affinities(pid: int) -> list[set[int]]:
    return [os.sched_getaffinity(int(tid)) for tid in os.listdir(f"/proc/{pid}/task")]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_pinned_apart_places_every_thread_and_restores():
    allowed = sorted(os.sched_getaffinity(0))
    manager = subprocess.Popen([sys.executable, "-c", THREADED])
    try:
        deadline = time.monotonic() + 30
        while len(os.listdir(f"/proc/{manager.pid}/task")) < 2:  # its second thread has started
            assert time.monotonic() < deadline, "the stand-in Manager never started its thread"
            time.sleep(0.01)
        executor = SimpleNamespace(_manager=SimpleNamespace(_process=SimpleNamespace(pid=manager.pid)))
        with pinned_apart([executor]) as placement:
            assert placement == {"bench_cpu": allowed[0], "manager_cpu": allowed[1]}
            assert _affinities(os.getpid()) == [{allowed[0]}] * len(os.listdir(f"/proc/{os.getpid()}/task"))
            assert _affinities(manager.pid) == [{allowed[1]}] * 2
        assert os.sched_getaffinity(0) == set(allowed)
    finally:
        manager.kill()
        manager.wait()


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_pinned_apart_restores_on_error_and_skips_a_gone_manager():
    allowed = os.sched_getaffinity(0)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    executor = SimpleNamespace(_manager=SimpleNamespace(_process=SimpleNamespace(pid=gone.pid)))
    with pytest.raises(RuntimeError):
        with pinned_apart([executor]):
            assert len(os.sched_getaffinity(0)) == 1
            raise RuntimeError("a timed run failed")
    assert os.sched_getaffinity(0) == allowed
