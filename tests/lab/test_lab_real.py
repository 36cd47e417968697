"""The lab on a real kube-apiserver v1.36.2 + etcd (envtest assets; skipped with the reason
without them): `fenced-k8s-repro --kube real`, one fault-free scenario, fenced, small size, one
scheduler (~2 minutes on an idle 2-core machine, 5 under load).
Nothing is emulated on the Kubernetes side: binding, status, graceful deletion and watches are
the real apiserver's, driven by real schedulers and the process kubelet."""

from __future__ import annotations

import argparse

import pytest

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def assets():
    from fenced_k8s_lab.controlplane import find_assets

    found, why = find_assets()
    if found is None:
        pytest.skip(why)
    return found


def test_needs_faults_sorts_the_scenarios():
    from fenced_k8s_lab.cli import needs_faults
    from fenced_k8s_lab.scenarios import SCENARIOS

    assert needs_faults(SCENARIOS["pending_storm"].drive) and needs_faults(SCENARIOS["watch_gap"].drive)
    assert not needs_faults(SCENARIOS["clear_churn"].drive)


def test_fenced_clear_churn_on_the_real_apiserver(assets, tmp_path):
    from fenced_k8s_lab.cli import run

    lines: list[str] = []
    args = argparse.Namespace(executor="fenced", scenario="pending_storm,clear_churn", schedulers=1, seed=7,
                              quick=True, out=None, json=None, kube="real", kubeconfig=None)
    results = run(args, say=lines.append)
    assert any("skipping ['pending_storm']" in line for line in lines), lines
    assert list(results) == ["clear_churn"]
    fenced = results["clear_churn"]["fenced"]
    assert fenced["tasks_succeeded"] == fenced["tasks"] > 0, fenced
    assert fenced["tasks_not_terminal"] == 0 and fenced["tasks_failed"] == 0, fenced
    assert fenced["pods_started_for_superseded_launch"] == 0 and fenced["stale_task_runs"] == 0, fenced
    assert fenced["duplicate_pods"] == 0 and fenced["false_positive_deletions"] == 0, fenced
