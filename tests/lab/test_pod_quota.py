"""The lab's namespace pod quota (``RunContext.pod_quota``, quota_storm): creates beyond the limit
are refused as the API server's quota admission refuses them (403 ``exceeded quota``), and a pod
that finishes gives its place back. On the emulator with the real kubernetes client."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from fenced_k8s_lab.runner import RunContext
from fenced_k8s_lab.scenarios import SCENARIOS, quota_message

pytestmark = pytest.mark.integration


def _create(api, name: str) -> ApiException | None:
    pod = client.V1Pod(metadata=client.V1ObjectMeta(name=name),
                       spec=client.V1PodSpec(containers=[client.V1Container(name="base", image="x")]))
    try:
        api.create_namespaced_pod("default", pod)
    except ApiException as error:
        return error
    return None


def _admitted(api, name: str, within: float = 10.0) -> bool:
    """Whether a create of ``name`` gets through within ``within`` seconds (the quota admits one
    create per look, every 0.1 s)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        refused = _create(api, name)
        if refused is None:
            return True
        assert refused.status == 403 and "exceeded quota" in refused.body, refused
        time.sleep(0.05)
    return False


def test_creates_beyond_the_quota_are_refused_until_a_pod_finishes(emulator, kube_api):
    ctx = RunContext(SCENARIOS["quota_storm"], 4, SimpleNamespace(namespace="default"), emulator, "d", print)
    ctx.pod_quota(2, quota_message(2))
    try:
        assert _admitted(kube_api, "p0") and _admitted(kube_api, "p1")
        assert not _admitted(kube_api, "p2", within=1.5)
        kube_api.patch_namespaced_pod_status("p0", "default", {"status": {"phase": "Succeeded"}})
        assert _admitted(kube_api, "p2")
        assert not _admitted(kube_api, "p3", within=1.5)
        assert {p["metadata"]["name"] for p in emulator.pods("default")} == {"p0", "p1", "p2"}
        assert ctx.faults[0]["what"] == "namespace pod quota: 2 pods"
    finally:
        ctx.close()
