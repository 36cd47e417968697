"""The `kube_backend` interface (tests/conftest.py) behaves the same on the emulator and the real apiserver."""

import pytest
from kubernetes import client, config

def test_backend_kubeconfig_audit_reset(kube, tmp_path):
    kube.ensure_namespace("kb-test")
    kube.set_tokens({"test": "test"})
    kc = kube.write_kubeconfig(str(tmp_path / "kc"), token="test", namespace="kb-test")
    v1 = client.CoreV1Api(config.new_client_from_config(config_file=kc))
    v1.create_namespaced_pod("kb-test", {"metadata": {"name": "p1"},
                                         "spec": {"containers": [{"name": "a", "image": "i"}]}})
    v1.list_namespaced_pod("kb-test")
    a = kube.audit()
    assert [(e["who"], e["verb"], e["name"], e["code"]) for e in a] == [
        ("test", "create", "p1", 201), ("test", "list", None, 200)]
    kube.reset()
    assert kube.audit() == []
    assert v1.list_namespaced_pod("kb-test").items == []


def test_backend_audits_and_reset_drops_leases(kube, tmp_path):
    kube.ensure_namespace("kb-leases")
    kube.set_tokens({"test": "test"})
    kc = kube.write_kubeconfig(str(tmp_path / "kc"), token="test", namespace="kb-leases")
    coord = client.CoordinationV1Api(config.new_client_from_config(config_file=kc))
    coord.create_namespaced_lease("kb-leases", {"metadata": {"name": "w", "finalizers": ["fenced.test/keep"]},
                                                "spec": {"holderIdentity": "test"}})
    coord.patch_namespaced_lease("w", "kb-leases", {"spec": {"leaseDurationSeconds": 5}},
                                 _content_type="application/merge-patch+json")
    assert [(e["who"], e["verb"], e["resource"], e["namespace"], e["name"], e["code"]) for e in kube.audit()] == [
        ("test", "create", "leases", "kb-leases", "w", 201), ("test", "patch", "leases", "kb-leases", "w", 200)]
    assert [x["metadata"]["name"] for x in kube.leases("kb-leases")] == ["w"]
    kube.reset()  # a finalizer does not keep it
    assert kube.audit() == []
    assert coord.list_namespaced_lease("kb-leases").items == []
    # only a real apiserver's own identity leases stay (kube-system)
    assert {x["metadata"]["namespace"] for x in kube.leases()} <= {"kube-system", "kube-node-lease"}


def test_missing_assets_give_the_reason(tmp_path, monkeypatch):
    from fenced_k8s_lab.controlplane import ControlPlane, find_assets

    (tmp_path / "etcd").write_text("#!/bin/sh\n")
    (tmp_path / "etcd").chmod(0o755)
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(tmp_path))
    found, why = find_assets()
    assert found is None and "KUBEBUILDER_ASSETS" in why and "lacks kube-apiserver" in why
    with pytest.raises(FileNotFoundError):
        ControlPlane()


def test_real_backend_processes_and_tokens(envtest_session):
    import os

    kube_backend = envtest_session
    assert kube_backend.url.startswith("https://127.0.0.1:")
    for pid in kube_backend.pids:
        os.kill(pid, 0)  # both alive, stopped by PID at session end
    kube_backend.set_tokens({"scheduler-200": "scheduler-200", "kubelet": "kubelet"})
    with pytest.raises(ValueError):
        kube_backend.set_tokens({"not-provisioned": "x"})
