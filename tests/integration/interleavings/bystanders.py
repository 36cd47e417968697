"""Pods the executors did not make: another deployment's, a tokenless (pre-upgrade) one, and pods
of this deployment whose annotations do not parse. None of them may be deleted, except a pod
whose scheduler-job-id does not parse: it still names a task of ours and a launch that is not
the task's current one, so the design lets any fence delete it.

Another deployment's pod carries the stamp its own executor derives from its own metadata DB's
identity (``deployment.identity_id``: another server, so another system identifier), whether it
reaches that DB at an address of its own or at the very address ours has (a proxy sidecar at the
same ``127.0.0.1:port/name``, issue 35 item 4). Its TI id is unknown to our DB; its task key is either its own DAG's or the
same as ours (the same DAG code deployed twice, a scheduled run id both share).
"""

from __future__ import annotations

import random
import uuid
from typing import Any

from fenced_k8s_executor.launch import LaunchIdentity, pod_name
from fenced_k8s_executor.names import SCHEDULER_JOB_ANNOTATION

from interleavings.model import Pod


def their_deployment_id(url: str, server: str) -> str:
    """The id another deployment's executor derives when ``url`` reaches its metadata DB on the
    PostgreSQL server whose system identifier is ``server``: the address plays no part."""
    from sqlalchemy.engine import make_url

    from fenced_k8s_executor import deployment

    url = make_url(url)
    return deployment.identity_id(url.get_backend_name(), server, url.database or "", None)


def our_url(machine: Any) -> Any:
    from airflow.configuration import conf
    from sqlalchemy.engine import make_url

    return make_url(conf.get("database", "sql_alchemy_conn"))


def make_pod(machine: Any, origin: str, *, same_address: bool = False, same_dag: bool = False,
             running: bool = False, field_: str | None = None) -> Pod:
    """Create the pod (as its own creator would have) and return its record."""
    from fenced_k8s_lab.core import our_deployment

    rng = random.Random(len(machine.trace))  # names only; deterministic per sequence
    world = machine.world
    task = world.dag_id, "t1", world.run_id
    collides = False
    if origin == "foreign":
        url = our_url(machine)
        url = url.set(password="theirs") if same_address else url.set(host="their-db.internal", port=5432)
        stamp = their_deployment_id(url.render_as_string(hide_password=False), str(rng.getrandbits(63)))
        collides = stamp == our_deployment()
        if not same_dag:
            task = "their_dag", "t1", "scheduled__2026-01-01T00:00:00+00:00"
        creator = str(machine.slots[0].sched.job_id)  # job ids of two DBs overlap
    else:
        stamp = our_deployment()
        creator = str(machine.legacy_job())
    launch = LaunchIdentity(ti_id=str(uuid.UUID(int=rng.getrandbits(128), version=4)),
                            token=str(uuid.UUID(int=rng.getrandbits(128), version=4)), try_number=1,
                            scheduler_job_id=creator, deployment=stamp)
    labels = {"kubernetes_executor": "True", "airflow-worker": creator, "dag_id": task[0], "task_id": task[1],
              "try_number": "1", "run_id": _label(task[2])}
    annotations = {"dag_id": task[0], "task_id": task[1], "run_id": task[2], "try_number": "1"}
    if origin != "tokenless":
        labels.update(launch.labels())
        annotations.update(launch.annotations())
    if origin == "malformed":
        if field_ == "map_index":
            annotations["map_index"] = "1e3"
        else:
            annotations[SCHEDULER_JOB_ANNOTATION] = "sched-7"
    # named as their executors name pods: a fenced one by its launch, a stock one at random
    if origin == "tokenless":
        name = f"{_dns(task[0])}-{_dns(task[1])}-{rng.getrandbits(32):08x}"
    else:
        name = pod_name(task[0], task[1], launch.token, 0)
    body = {"metadata": {"name": name, "labels": labels, "annotations": annotations},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "base", "image": "x"}]}}
    world.kube.create_namespaced_pod(world.namespace, body)
    if running:
        machine.kubelet.start(name)
    pod = Pod(name=name, origin=origin, task=task[1] if task[0] == world.dag_id else None,
              launch=None if origin == "tokenless" else launch.token,
              ti_id=launch.ti_id, creator=creator, phase="Running" if running else "Pending", collides=collides,
              # an unreadable creator id still names a task: a superseded launch of ours, fair to fence
              protected=not (origin == "malformed" and field_ != "map_index"))
    machine.pods[name] = pod
    return pod


def _dns(value: str) -> str:
    return value.lower().replace("_", "-")


def _label(value: str) -> str:
    from airflow.providers.cncf.kubernetes.pod_generator import make_safe_label_value

    return make_safe_label_value(value)
