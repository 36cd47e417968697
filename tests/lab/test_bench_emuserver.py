"""The benchmark's emulator process answers a paginated list as the lab emulator does, for every
kind it serves (its lazy pagination once unpacked the pods' kind entry only: a Lease list, or any
list after a kind gained a field, answered 500), and a child that prints after its ready line is
never blocked by a pipe nobody reads (the emulator logs a handler's traceback to stdout)."""

from __future__ import annotations

import json
import sys
import urllib.request

import pytest

from fenced_k8s_lab.bench import emuserver
from fenced_k8s_lab.bench.env import Proc
from fenced_k8s_lab.kubeapi import resources

TOKEN = "bench"


def _get(url: str, path: str) -> dict:
    req = urllib.request.Request(url + path, headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def _post(url: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def _pages(url: str, path: str, limit: int) -> tuple[list[dict], list[str]]:
    items, kinds, token = [], [], ""
    while True:
        page = _get(url, f"{path}?limit={limit}" + (f"&continue={token}" if token else ""))
        items += page["items"]
        kinds.append(f"{page['apiVersion']} {page['kind']}")
        token = page["metadata"].get("continue")
        if not token:
            return items, kinds


@pytest.fixture
def bench_emulator(monkeypatch):
    stock = resources.Resources.list_or_watch
    monkeypatch.setattr(resources.Resources, "list_or_watch", emuserver._lazy_list(stock))
    emu = emuserver.BenchEmulator("127.0.0.1", 0, tokens={TOKEN: TOKEN})
    url = emu.start()
    yield url, stock
    emu.stop()


@pytest.mark.parametrize("kind,path,list_kind", [
    ("pods", "/api/v1/namespaces/ns/pods", "v1 PodList"),
    ("leases", "/apis/coordination.k8s.io/v1/namespaces/ns/leases", "coordination.k8s.io/v1 LeaseList"),
])
def test_a_paginated_list_of_every_kind_is_the_emulators_own(bench_emulator, monkeypatch, kind, path, list_kind):
    url, stock = bench_emulator
    _post(url, "/api/v1/namespaces", {"metadata": {"name": "ns"}})
    for i in range(5):
        body = ({"metadata": {"name": f"p{i}"}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
                if kind == "pods" else {"metadata": {"name": f"l{i}"}, "spec": {"holderIdentity": "h"}})
        _post(url, path, body)
    lazy, kinds = _pages(url, path, limit=2)
    monkeypatch.setattr(resources.Resources, "list_or_watch", stock)
    own, own_kinds = _pages(url, path, limit=2)
    assert len(lazy) == 5 and lazy == own
    assert kinds == own_kinds == [list_kind] * 3


def test_a_child_printing_after_its_ready_line_is_never_blocked(tmp_path):
    """Past 64 KiB of unread output a child's print blocks: the drained pipe lets it finish."""
    child = "import sys; print('READY now', flush=True); [print('x' * 1023) for _ in range(512)]; print('END')"
    proc = Proc([sys.executable, "-c", child], tmp_path / "child.log")
    assert proc.ready_line("READY", timeout=30) == "READY now"
    assert proc.p.wait(30) == 0
    proc.stop()
    assert (tmp_path / "child.log").read_text().rstrip().endswith("END")
