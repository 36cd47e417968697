"""The `kube_backend` interface (tests/conftest.py) behaves the same on the emulator and the real apiserver."""

import time
from kubernetes import client, config

def test_backend_kubeconfig_audit_reset(kube, tmp_path):
    kube.ensure_namespace("kb-test")
    kube.set_tokens({"test": "test"})
    kc = kube.write_kubeconfig(str(tmp_path / "kc"), token="test", namespace="kb-test")
    v1 = client.CoreV1Api(config.new_client_from_config(config_file=kc))
    v1.create_namespaced_pod("kb-test", {"metadata": {"name": "p1"}, "spec": {"containers": [{"name": "a", "image": "i"}]}})
    v1.list_namespaced_pod("kb-test")
    a = kube.audit()
    assert [(e["who"], e["verb"], e["name"], e["code"]) for e in a] == [("test", "create", "p1", 201), ("test", "list", None, 200)]
    kube.reset()
    assert kube.audit() == []
    assert v1.list_namespaced_pod("kb-test").items == []
