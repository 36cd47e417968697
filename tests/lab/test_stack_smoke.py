"""End to end: emulator + process kubelet + real Airflow (api-server, dag-processor, one
scheduler with the STOCK KubernetesExecutor) on embedded PostgreSQL run one real Task SDK pod
(`python -m airflow.sdk.execution_time.execute_workload`) to success. ~1 minute.
"""

from __future__ import annotations

import time

import pytest

from fenced_k8s_lab.kubelet import read_records
from fenced_k8s_lab.stack import STOCK_EXECUTOR

pytestmark = pytest.mark.lab


def _wait_finished_pod(records_path, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        done = [r for r in read_records(records_path).values() if r["finished_at"]]
        if done or time.monotonic() > deadline:
            assert len(done) == 1, done
            return done[0]
        time.sleep(0.2)


def test_one_real_task_pod_succeeds(airflow_stack_factory, kubelet_factory, lab_dags, emulator):
    t0 = time.monotonic()
    stack = airflow_stack_factory(lab_dags, executor=STOCK_EXECUTOR, schedulers=1)
    kubelet = kubelet_factory(base_env=stack.worker_env())
    client = stack.client()
    client.wait_dags(["lab_smoke"], timeout=120)
    started = time.monotonic() - t0

    run = client.trigger("lab_smoke")
    final = client.wait_run("lab_smoke", run["dag_run_id"], timeout=240)
    ran = time.monotonic() - t0 - started
    memory = stack.memory_mb()
    tis = client.task_instances("lab_smoke", run["dag_run_id"])
    pod = _wait_finished_pod(kubelet.records_path)  # the TI reports success before the process exits
    print(f"stack+dags ready {started:.1f}s, run {ran:.1f}s, "
          f"timings {stack.timings}, PSS MB {memory}")

    assert final["state"] == "success", [s.tail() for s in stack.schedulers]
    assert [ti["state"] for ti in tis] == ["success"]
    assert tis[0]["hostname"] == pod["name"]  # hostname_callable -> HOSTNAME -> pod name
    assert pod["exit_code"] == 0 and pod["reason"] == "Completed"
    creators = {a["who"] for a in emulator.audit() if a["verb"] == "create" and a["resource"] == "pods"
                and not a.get("subresource")}
    assert creators == {"scheduler-0"}
