"""Write faults behave the same on the emulator and on the real apiserver (where an admission
webhook makes them: fenced_k8s_lab/webhook.py): a denied write carries the fault's status code
and is not carried out, `who`, `times` and `after` pick the requests, a delay is latency the
client sees, and cleared faults no longer fire. Reads cannot be faulted on the real apiserver:
asking raises, so no test passes there without its fault."""

from __future__ import annotations

import time

import pytest

from fenced_k8s_lab.kubeapi.errors import REASONS

CODES = [403, 404, 409, 429, 500, 503]


def _names(v1, ns) -> set[str]:
    return {p.metadata.name for p in v1.list_namespaced_pod(ns).items}


def test_denied_create_carries_each_status_code_and_stores_nothing(v1, ns, faults, make_pod, h):
    make_pod("before")  # the namespace's default service account is there (real apiserver)
    for code in CODES:
        faults.add_fault(method="POST", path=rf"/namespaces/{ns}/pods$", status=code, times=1)
    for code in CODES:
        with pytest.raises(h.ApiException) as err:
            v1.create_namespaced_pod(ns, h.pod_body(name=f"denied-{code}"))
        status = h.status_of(err.value)
        assert (err.value.status, status["code"], status["reason"]) == (code, code, REASONS[code])
        assert "injected fault" in status["message"]
    v1.create_namespaced_pod(ns, h.pod_body(name="after"))  # every fault fired its one time
    assert _names(v1, ns) == {"before", "after"}
    assert [f["fired"] for f in faults.faults()] == [1] * len(CODES)


def test_denied_delete_by_status_and_caller(v1, ns, faults, make_pod, h):
    name = make_pod().metadata.name
    other = faults.add_fault(method="DELETE", path=rf"/pods/{name}$", status=500, who="somebody-else")
    ours = faults.add_fault(method="DELETE", path=rf"/pods/{name}$", status=503, who="conformance", times=1)
    with pytest.raises(h.ApiException) as err:
        v1.delete_namespaced_pod(name, ns)
    assert err.value.status == 503
    assert name in _names(v1, ns)  # the denied delete was not carried out
    v1.delete_namespaced_pod(name, ns)  # ours is spent, the other caller's never matches us
    assert name not in _names(v1, ns)
    fired = {f["id"]: f["fired"] for f in faults.faults()}
    assert (fired[other], fired[ours]) == (0, 1)


def test_denied_patch_leaves_the_pod_and_its_status_patches_alone(v1, ns, faults, make_pod, h):
    name = make_pod(labels={"l": "1"}).metadata.name
    faults.add_fault(method="PATCH", path=rf"/pods/{name}$", status=409)
    with pytest.raises(h.ApiException) as err:
        v1.patch_namespaced_pod(name, ns, {"metadata": {"labels": {"l": "2"}}})
    assert err.value.status == 409 and "injected fault" in h.status_of(err.value)["message"]
    assert v1.read_namespaced_pod(name, ns).metadata.labels == {"l": "1"}
    # the kubelet-style status patch is another path (/status): not matched, carried out
    v1.patch_namespaced_pod_status(name, ns, {"status": {"phase": "Running"}})
    assert v1.read_namespaced_pod(name, ns).status.phase == "Running"


def test_delayed_create_is_latency_the_client_sees(v1, ns, faults, make_pod, h):
    make_pod("warm")
    faults.add_fault(method="POST", path=rf"/namespaces/{ns}/pods$", delay=1.0, times=1)
    started = time.monotonic()
    v1.create_namespaced_pod(ns, h.pod_body(name="slow"))
    assert time.monotonic() - started >= 0.9  # a lower bound only: a loaded box may take longer
    assert "slow" in _names(v1, ns)


def test_times_and_after(v1, ns, faults, make_pod, h):
    make_pod("f-1")  # before the fault: the namespace is ready
    fid = faults.add_fault(method="POST", path=rf"/namespaces/{ns}/pods$", status=503, times=1, after=1)
    v1.create_namespaced_pod(ns, h.pod_body(name="f-2"))  # skipped by after=1
    with pytest.raises(h.ApiException) as err:
        v1.create_namespaced_pod(ns, h.pod_body(name="f-3"))
    assert err.value.status == 503
    v1.create_namespaced_pod(ns, h.pod_body(name="f-4"))  # times=1 exhausted
    assert _names(v1, ns) == {"f-1", "f-2", "f-4"}
    (fault,) = [f for f in faults.faults() if f["id"] == fid]
    assert (fault["seen"], fault["fired"]) == (2, 1)


def test_cleared_faults_no_longer_fire(v1, ns, faults, make_pod, h):
    make_pod("warm")
    faults.add_fault(method="POST", path=rf"/namespaces/{ns}/pods$", status=500)
    with pytest.raises(h.ApiException):
        v1.create_namespaced_pod(ns, h.pod_body(name="denied"))
    faults.clear_faults()
    assert faults.faults() == []
    v1.create_namespaced_pod(ns, h.pod_body(name="allowed"))
    assert _names(v1, ns) == {"warm", "allowed"}
    if faults.name == "real":  # no webhook stays registered: other tests' writes pay nothing
        from fenced_k8s_lab.webhook import CONFIG_NAME

        assert faults._api("GET", "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations/"
                                  f"{CONFIG_NAME}", ok=(404,)) is None


def test_faults_a_webhook_cannot_make_are_refused(faults, ns):
    if faults.supports_faults:
        pytest.skip("the emulator makes every fault")
    for spec in ({"method": "GET", "status": 500}, {"method": "*", "status": 500},
                 {"method": "POST", "drop": True}, {"method": "POST", "persist_then_timeout": True}):
        with pytest.raises(NotImplementedError):
            faults.add_fault(path=rf"/namespaces/{ns}/pods", **spec)
    assert faults.faults() == []
