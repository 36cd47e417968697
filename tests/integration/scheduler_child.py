"""A scheduler in a process of its own, for the tests that kill one with SIGKILL.

A real SchedulerJob row and executor (``lab.core.Scheduler``) in the environment the test set up
(metadata DB, kubeconfig, namespace, pod template): it queues the run (the scheduler's critical
section pre-assigns the tokens), creates the pods, prints ``READY`` and ``{"job_id": ...}`` on one line, and
then loops as a scheduler does (executor sync, heartbeat) until it is killed.

    python tests/integration/scheduler_child.py KIND DAG_ID RUN_ID HOSTNAME
"""

from __future__ import annotations

import importlib
import json
import sys
import time

READY = "scheduler-child-ready "


def main() -> None:
    kind, dag_id, run_id, hostname = sys.argv[1:5]
    from airflow import settings
    from airflow.jobs.job import perform_heartbeat

    settings.configure_vars()
    settings.reconfigure_orm()
    from fenced_k8s_lab.core import Scheduler
    from fenced_k8s_lab.stack import STOCK_EXECUTOR
    from fenced_k8s_executor.names import EXECUTOR_CLASS_PATH

    module, _, name = (STOCK_EXECUTOR if kind == "stock" else EXECUTOR_CLASS_PATH).rpartition(".")
    job = Scheduler.new_job(hostname=hostname)
    executor = getattr(importlib.import_module(module), name)()
    executor.job_id = job.id
    sched = Scheduler(job, [executor])
    executor.start()
    sched.queue(dag_id, run_id)
    executor.sync()  # the creation batch: the pods are created
    print(READY + json.dumps({"job_id": job.id}), flush=True)
    while True:
        executor.sync()
        perform_heartbeat(job, heartbeat_callback=sched.runner.heartbeat_callback, only_if_necessary=True)
        time.sleep(0.2)


if __name__ == "__main__":
    main()
