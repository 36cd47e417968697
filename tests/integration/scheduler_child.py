"""A scheduler in a process of its own, for the tests that kill one with SIGKILL, or that run one
against another metadata database (a copy of the test's).

A real SchedulerJob row and executor (``lab.core.Scheduler``) in the environment the test set up
(metadata DB, kubeconfig, namespace, pod template): it queues the run (the scheduler's critical
section pre-assigns the tokens), creates the pods, prints ``READY`` and ``{"job_id": ...}`` on one line, and
then loops as a scheduler does (schedule and queue, executor sync, executor events, heartbeat)
until it is killed.

With ``--serve`` it also takes one command per line on stdin, carried out between two loops
through airflow-core's own code (``fenced_k8s_lab.core``), and answers ``DONE`` and a JSON object:

    {"op": "clear", "task": "t1"}      clear_task_instances
    {"op": "retry", "task": "t1"}      the execution API's PATCH /state up_for_retry
    {"op": "run", "task": "t1", "hostname": "pod"}   the execution API's PATCH /run
    {"op": "stuck"}                    _handle_tasks_stuck_in_queued (timeout 0)
    {"op": "adopt"}                    adopt_or_reset_orphaned_tasks
    {"op": "row", "task": "t1"}        the task's row

    python tests/integration/scheduler_child.py KIND DAG_ID RUN_ID HOSTNAME [--serve]
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import queue
import sys
import threading
import time

READY = "scheduler-child-ready "
DONE = "scheduler-child-done "


def main() -> None:
    kind, dag_id, run_id, hostname = sys.argv[1:5]
    serve = "--serve" in sys.argv[5:]
    from airflow import settings
    from airflow.jobs.job import perform_heartbeat

    settings.configure_vars()
    settings.reconfigure_orm()
    from fenced_k8s_lab.core import Airflow, Scheduler
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
    commands: queue.Queue = queue.Queue()
    airflow = None
    if serve:
        airflow = Airflow(os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
        threading.Thread(target=_read, args=(commands,), daemon=True).start()
    while True:
        if serve:
            sched.queue(dag_id, run_id)  # what the scheduler loop queues: re-queues after a clear or a retry
        executor.sync()
        if serve:
            sched.process_events()
        perform_heartbeat(job, heartbeat_callback=sched.runner.heartbeat_callback, only_if_necessary=True)
        try:
            command = commands.get_nowait()
        except queue.Empty:
            time.sleep(0.2)
            continue
        try:
            answer = _carry_out(command, sched, airflow, dag_id, run_id)
        except Exception as error:  # the test reads the answer; the scheduler goes on
            answer = {"error": repr(error)}
        print(DONE + json.dumps(answer, default=str), flush=True)


def _read(commands: queue.Queue) -> None:
    for line in sys.stdin:
        if line.strip():
            commands.put(json.loads(line))


def _carry_out(command: dict, sched, airflow, dag_id: str, run_id: str) -> dict:
    op = command["op"]
    row = airflow.row(dag_id, command["task"], run_id) if "task" in command else None
    if op == "clear":
        airflow.clear(row)
    elif op == "retry":
        airflow.finish(row, "up_for_retry")
    elif op == "run":
        airflow.start(row, hostname=command["hostname"])
    elif op == "stuck":
        sched.stuck_in_queued(timeout=0.0)
    elif op == "adopt":
        return {"reset": sched.adopt_or_reset_orphans()}
    elif op != "row":
        raise ValueError(f"unknown op {op!r}")
    found = airflow.row(dag_id, command["task"], run_id) if "task" in command else None
    return {"row": dataclasses.asdict(found) if found is not None else None}


if __name__ == "__main__":
    main()
