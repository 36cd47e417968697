"""The drop-in contract: user pod customisation survives, legacy rows and pods get the stock
treatment, audit mode reports without acting, off mode is the stock executor, bad options stop
the executor at start, and Airflow sees the package as a provider."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from fenced_k8s_executor import config
from fenced_k8s_executor.lab import seed
from fenced_k8s_executor.names import TI_ID_LABEL, TOKEN_ANNOTATION, TOKEN_LABEL

JOB = 31


def test_user_pod_template_override_and_mutation_hook_all_apply(world, make_executor, monkeypatch):
    from kubernetes.client import models as k8s

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
    executor = make_executor("fenced", JOB)
    (ti,) = world.tis("custom", job_id=JOB)
    workload = world.workload(ti)
    workload.ti.executor_config = {
        "pod_override": k8s.V1Pod(
            metadata=k8s.V1ObjectMeta(annotations={"team": "data"}),
            spec=k8s.V1PodSpec(containers=[k8s.V1Container(
                name="base", resources=k8s.V1ResourceRequirements(requests={"cpu": "250m"}))]),
        )
    }
    executor.queue_workload(workload, session=None)
    executor.trigger_tasks(open_slots=8)
    executor.sync()
    (pod,) = world.pods(ti)
    meta, container = pod.metadata, pod.spec.containers[0]
    assert meta.labels["from-template"] == "yes" and meta.labels["mutated-by"] == "hook"
    assert meta.annotations["team"] == "data"
    assert container.resources.requests == {"cpu": "250m"}
    assert {"name": "FROM_TEMPLATE", "value": "1"} in [{"name": e.name, "value": e.value} for e in container.env]
    assert meta.annotations[TOKEN_ANNOTATION] == ti.token
    assert meta.labels[TOKEN_LABEL] == ti.token and meta.labels[TI_ID_LABEL] == ti.id
    assert meta.labels["airflow-worker"] == str(JOB)  # the provider's own labels are intact
    assert container.args[:3] == ["python", "-m", "fenced_k8s_executor.worker"]


@pytest.mark.parametrize("legacy_value", [None, str(JOB)])
def test_legacy_rows_get_the_stock_treatment(world, make_executor, legacy_value):
    """Rows queued by a stock scheduler carry no token (or the job id): never fenced, so a
    same-id re-queue behaves exactly as under the stock executor."""
    executor = make_executor("fenced", JOB)
    (ti,) = world.tis("legacy", job_id=JOB, with_token=False)
    if legacy_value:
        with world.engine.begin() as conn:
            conn.exec_driver_sql("UPDATE task_instance SET external_executor_id=%s WHERE id=%s", (legacy_value, ti.id))
        ti = seed.SeededTI(**{**ti.__dict__, "token": legacy_value})
    world.queue(executor, ti)
    world.queue(executor, ti)  # a second job of the same launch, as under race a1
    executor.sync()
    pods = world.pods(ti)
    assert len(pods) == 2  # what the stock executor does
    assert all(TOKEN_ANNOTATION not in (p.metadata.annotations or {}) for p in pods)
    assert executor.event_buffer[world.ref(ti, JOB).key] == ("queued", str(JOB))  # stock info


def test_audit_mode_reports_but_acts_like_stock(world, make_executor, caplog):
    """Race a1 under audit: both pods are created (stock), the drop is reported as not enforced."""
    executor = make_executor("fenced", JOB, mode="audit", sweep_interval="0.3")
    (ti,) = world.tis("audit", job_id=JOB)
    world.queue(executor, ti)
    ti2 = seed.requeue_same_id(world.engine, ti, JOB)
    world.queue(executor, ti2)
    with caplog.at_level(logging.INFO, logger="fenced_k8s_executor"):
        executor.sync()
        world.settle(executor, 1.5)  # post-create re-check and sweep run, and only report
    assert len([p for p in world.pods(ti) if not p.metadata.deletion_timestamp]) == 2
    assert world.deletes_by(f"scheduler-{JOB}") == []
    lines = [r.getMessage() for r in caplog.records]
    assert any("decision=launch.dropped" in m and "reason=superseded" in m and "enforced=False" in m for m in lines)
    assert any("decision=pod.stale" in m and "path=sweep" in m and "enforced=False" in m for m in lines)
    assert not any(ti.token in m or ti2.token in m for m in lines)  # short tokens only


def test_off_mode_is_the_stock_executor(world, make_executor):
    executor = make_executor("fenced", JOB, mode="off")
    (ti,) = world.tis("off", job_id=JOB)
    world.queue(executor, ti)
    ti2 = seed.requeue_same_id(world.engine, ti, JOB)
    world.queue(executor, ti2)
    executor.sync()
    assert len(world.pods(ti)) == 2
    assert executor.event_buffer[world.ref(ti, JOB).key] == ("queued", str(JOB))


def test_bad_option_fails_at_start_naming_option_and_values(world, make_executor):
    with pytest.raises(config.FencedConfigError) as excinfo:
        make_executor("fenced", JOB, mode="strict")
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
