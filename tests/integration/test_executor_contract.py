"""The drop-in contract: user pod customisation survives, legacy rows and pods get the stock
treatment, audit mode reports without acting, off mode is the stock executor, bad options stop
the executor at start, Airflow sees the package as a provider, and every queued launch is
recorded whichever way execute_async is reached."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from fenced_k8s_executor import config
from fenced_k8s_executor.names import TI_ID_LABEL, TOKEN_ANNOTATION, TOKEN_LABEL

POD_OVERRIDE = (
    'executor_config={"pod_override": k8s.V1Pod('
    'metadata=k8s.V1ObjectMeta(annotations={"team": "data"}), '
    'spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="base", '
    'resources=k8s.V1ResourceRequirements(requests={"cpu": "250m"}))]))}'
)


@pytest.mark.tasks("custom", imports="from kubernetes.client import models as k8s", task_kwargs=POD_OVERRIDE)
def test_user_pod_template_override_and_mutation_hook_all_apply(world, monkeypatch):
    import airflow.settings

    def hook(pod):
        pod.metadata.labels["mutated-by"] = "hook"

    monkeypatch.setattr(airflow.settings, "pod_mutation_hook", hook)
    template = world.tmp_path / "custom_template.yaml"
    template.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: x\n  labels:\n    from-template: 'yes'\n"
        "spec:\n  restartPolicy: Never\n  containers:\n    - name: base\n      image: lab/airflow:local\n"
        "      env:\n        - name: FROM_TEMPLATE\n          value: '1'\n"
    )
    monkeypatch.setenv("AIRFLOW__KUBERNETES_EXECUTOR__POD_TEMPLATE_FILE", str(template))
    # the task's executor_config comes from the DAG file (the tasks marker), as users write it
    sched = world.scheduler("fenced")
    world.queue(sched)
    sched.executor.sync()
    row = world.row("custom")
    (pod,) = world.pods(row)
    meta, container = pod.metadata, pod.spec.containers[0]
    assert meta.labels["from-template"] == "yes" and meta.labels["mutated-by"] == "hook"
    assert meta.annotations["team"] == "data"
    assert container.resources.requests == {"cpu": "250m"}
    assert {"name": "FROM_TEMPLATE", "value": "1"} in [{"name": e.name, "value": e.value} for e in container.env]
    assert row.token and meta.annotations[TOKEN_ANNOTATION] == row.token
    assert meta.labels[TOKEN_LABEL] == row.token and meta.labels[TI_ID_LABEL] == row.id
    assert meta.labels["airflow-worker"] == str(sched.job_id)  # the provider's own labels are intact
    program = (container.command or []) + (container.args or [])
    assert program[0] == "python" and "fenced_k8s_executor.worker" in " ".join(program[:3])


@pytest.mark.parametrize("legacy_value", ["none", "job_id"])
def test_legacy_rows_and_pods_get_the_stock_treatment(world, legacy_value):
    """A stock scheduler queued the TI (row: no token, or its job id after its QUEUED event) and
    made a pod without a token, then died. The fenced peer adopts that pod like the stock
    executor does, never deletes it, and its terminal event reaches the scheduler."""
    old = world.scheduler("stock")
    world.queue(old)
    old.executor.sync()
    if legacy_value == "job_id":
        old.process_events()
    row = world.row("t1")
    assert row.token == (str(old.job_id) if legacy_value == "job_id" else None)
    pod = world.pod_of(row)
    assert TOKEN_ANNOTATION not in (world.kube.read_namespaced_pod(pod, world.namespace).metadata.annotations or {})
    world.set_pod_phase(pod, "Running")
    world.kill(old)
    peer = world.scheduler("fenced", sweep_interval="0.3")
    peer.adopt_or_reset_orphans()
    after = world.row("t1")
    assert (after.id, after.queued_by_job_id) == (row.id, peer.job_id)  # adopted, not reset
    assert row.key in peer.executor.running
    live = world.kube.read_namespaced_pod(pod, world.namespace)
    assert live.metadata.labels["airflow-worker"] == str(peer.job_id)
    world.settle(peer.executor, 1.0)
    world.set_pod_phase(pod, "Succeeded")
    world.sync_until(peer.executor, lambda: row.key not in peer.executor.running, timeout=6)
    assert row.key not in peer.executor.running
    assert row.key in peer.executor.event_buffer
    assert world.deletes_by(peer) == []


def _a1(world, sched):
    world.queue(sched)
    first = world.row("t1")
    world.requeue_stuck(sched)
    return first, world.row("t1")


def test_audit_mode_reports_but_acts_like_stock(world, caplog):
    """Race a1 under audit: both pods are created (stock), the drop is reported as not enforced."""
    sched = world.scheduler("fenced", mode="audit", sweep_interval="0.3")
    first, second = _a1(world, sched)
    with caplog.at_level(logging.INFO, logger="fenced_k8s_executor"):
        sched.executor.sync()
        world.settle(sched.executor, 1.5)  # post-create re-check and sweep run, and only report
    assert len(world.live_pods(second)) == 2
    assert world.deletes_by(sched) == []
    lines = [r.getMessage() for r in caplog.records]
    assert any("decision=launch.dropped" in m and "reason=superseded" in m and "enforced=False" in m for m in lines)
    assert any("decision=pod.stale" in m and "path=sweep" in m and "enforced=False" in m for m in lines)
    assert not any(first.token in m or second.token in m for m in lines)  # short tokens only


def test_off_mode_is_the_stock_executor(world):
    sched = world.scheduler("fenced", mode="off")
    first, second = _a1(world, sched)
    sched.executor.sync()
    assert len(world.pods(second)) == 2
    assert sched.executor.event_buffer[second.key] == ("queued", str(sched.job_id))


def test_bad_option_fails_at_start_naming_option_and_values(world):
    with pytest.raises(config.FencedConfigError) as excinfo:
        world.scheduler("fenced", mode="strict")
    assert "[fenced_kubernetes_executor] mode" in str(excinfo.value)
    assert "enforce | audit | off" in str(excinfo.value)


def test_airflow_lists_the_provider_and_its_config_section(metadata_db):
    env_cmd = [sys.executable, "-m", "airflow"]
    listed = subprocess.run([*env_cmd, "providers", "list", "-o", "json"], capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "missing 'cli' section" not in listed.stdout + listed.stderr
    names = {p["package_name"] for p in json.loads(listed.stdout[listed.stdout.index("[{"):])}
    assert "fenced-k8s-executor" in names
    section = subprocess.run([*env_cmd, "config", "get-value", "fenced_kubernetes_executor", "mode"],
                             capture_output=True, text=True, timeout=120)
    assert section.returncode == 0 and section.stdout.strip() == "enforce", section.stderr[-2000:]


@pytest.mark.parametrize("path", ["trigger_tasks", "execute_async alone"])
def test_every_queued_launch_is_recorded_and_its_queued_event_dropped(world, path):
    """The launch's bookkeeping (slot holder, no QUEUED event) runs once per trigger_tasks batch,
    after the provider's loop; execute_async called on its own records at once."""
    sched = world.scheduler("fenced")
    executor = sched.executor
    if path == "trigger_tasks":
        world.queue(sched)
    else:
        world.queue(sched, trigger=False)
        for key, workload in list(executor.queued_tasks.items()):  # as the provider's loop would
            del executor.queued_tasks[key]
            executor.running.add(key)
            executor.execute_async(key=key, command=[workload])
    row = world.row("t1")
    assert row.token and row.key in executor.running
    assert executor.book.holder(row.key) == row.token
    assert row.key not in executor.event_buffer
