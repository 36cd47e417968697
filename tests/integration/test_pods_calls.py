"""The sweep's pod calls against a real API (the emulator and the real kube-apiserver).

pods.list_pages: the prefetching pager yields exactly what the plain pager yields, in order, one
list call per page, and hands a failed list to its caller (the sweep's "no evidence, next
interval"). pods.Deletes: every submitted pod gets exactly one guarded delete and its outcome,
whatever another outcome's report does."""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid

import pytest
from kubernetes.client.rest import ApiException

from fenced_k8s_executor import pods

PODS = 7
PAGE = 3
LABEL = "paging-test=yes"


@pytest.fixture
def paged(kube, tmp_path):
    """A namespace holding PODS labelled pods, and a client (user "test") with it as default."""
    from kubernetes import client, config

    namespace = f"paging-{uuid.uuid4().hex[:8]}"
    kube.ensure_namespace(namespace)
    kube.set_tokens({"test": "test"})
    api = client.CoreV1Api(config.new_client_from_config(
        config_file=kube.write_kubeconfig(str(tmp_path / "test.kubeconfig"), token="test", namespace=namespace)))
    for i in range(PODS):
        api.create_namespaced_pod(namespace, {
            "metadata": {"name": f"p{i}", "labels": {"paging-test": "yes"}},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "base", "image": "x"}]}})
    return api, namespace


def _lists(kube, namespace: str, expected: int) -> int:
    """List calls in ``namespace``, once ``expected`` are on record or 3 s have passed (the real
    apiserver writes its audit log when a response completes)."""
    deadline = time.monotonic() + 3
    while True:
        found = sum(1 for e in kube.audit() if e.get("verb") == "list" and e.get("namespace") == namespace)
        if found >= expected or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


@pytest.mark.parametrize("prefetch", [False, True])
def test_every_page_in_order_one_list_call_each(kube, paged, prefetch):
    api, namespace = paged
    pages = [[ref.name for ref in page]
             for page in pods.list_pages(api, namespace, label_selector=LABEL, page_size=PAGE, prefetch=prefetch)]
    assert sorted(name for page in pages for name in page) == [f"p{i}" for i in range(PODS)]
    assert [len(page) for page in pages] == [3, 3, 1]
    assert _lists(kube, namespace, len(pages)) == len(pages)  # none beyond the last page


def test_a_failed_page_is_raised_to_the_caller_after_the_pages_before_it(kube, needs_faults, paged):
    api, namespace = paged
    kube.add_fault(method="GET", path=r"/pods$", status=500, after=1, who="test")
    seen = []
    with pytest.raises(ApiException):
        for page in pods.list_pages(api, namespace, label_selector=LABEL, page_size=PAGE, prefetch=True):
            seen.append(page)
    assert len(seen) == 1


def _refs(api, namespace: str) -> list:
    return [ref for page in pods.list_pages(api, namespace, label_selector=LABEL) for ref in page]


def _deletes(kube, namespace: str, expected: int) -> int:
    deadline = time.monotonic() + 3
    while True:
        found = sum(1 for e in kube.audit() if e.get("verb") == "delete" and e.get("namespace") == namespace)
        if found >= expected or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def test_deletes_delete_each_submitted_pod_once_and_report_its_outcome(kube, paged):
    api, namespace = paged
    refs = _refs(api, namespace)
    outcomes: dict[str, bool | None] = {}
    deletes = pods.Deletes(api, workers=3)
    for ref in refs:
        deletes.submit(ref, lambda result, name=ref.name: outcomes.__setitem__(name, result))
    deletes.close()
    assert outcomes == {ref.name: True for ref in refs}
    assert _refs(api, namespace) == []
    assert _deletes(kube, namespace, PODS) == PODS


def test_deletes_keep_the_uid_precondition_and_survive_a_failing_report(kube, paged):
    api, namespace = paged
    refs = _refs(api, namespace)
    impostor = dataclasses.replace(refs[0], uid=str(uuid.uuid4()))  # same name, another object
    outcomes: list[tuple[str, bool | None]] = []

    def report(name: str, result: bool | None) -> None:
        outcomes.append((name, result))
        if name == refs[1].name:
            raise RuntimeError("a metrics backend that fails")

    deletes = pods.Deletes(api, workers=1)  # one worker: it must outlive the failing report

    def sweep() -> None:
        for ref in [impostor, *refs[1:]]:
            deletes.submit(ref, lambda result, name=ref.name: report(name, result))
        deletes.close()

    sweeping = threading.Thread(target=sweep, daemon=True)
    sweeping.start()
    sweeping.join(30)
    assert not sweeping.is_alive(), "the worker died with the failing report: submit/close never return"
    assert sorted(outcomes) == sorted([(impostor.name, False)] + [(ref.name, True) for ref in refs[1:]])
    assert [ref.name for ref in _refs(api, namespace)] == [refs[0].name]  # the precondition held
