"""Pods the executors did not make: another deployment's, a tokenless (pre-upgrade) one, and pods
of this deployment whose annotations do not read (hostile). None of them may be deleted.

Another deployment's pod carries the stamp its own executor derives from its own metadata DB's
identity (``deployment.identity_id``: another server, so another system identifier), whether it
reaches that DB at an address of its own or at the very address ours has (a proxy sidecar at the
same ``127.0.0.1:port/name``, issue 35 item 4). Its TI id is unknown to our DB; its task key is either its own DAG's or the
same as ours (the same DAG code deployed twice, a scheduled run id both share).

A *hostile* pod (issue 45 item 4: a pod's annotations are a trust boundary) is a copy of a pod of
a superseded launch of ours, launched by a live scheduler of ours (its job id and start): read as
a launch, any fence would delete it. One annotation holds a value that field cannot read
(``HOSTILE``, the values of ``test_hostile_annotations``). Every such pod names no launch, or a
launcher that does not read (no scheduler of this database, by the witness: issue 52), and must
cost that pod alone: never deleted, nothing raised, the other pods judged as before.
"""

from __future__ import annotations

import random
import uuid
from typing import Any

from fenced_k8s_executor.launch import Launcher, LaunchIdentity, pod_name
from fenced_k8s_executor.names import (DEPLOYMENT_ANNOTATION, REGION_ANNOTATION, SCHEDULER_JOB_ANNOTATION, SCHEDULER_STARTED_ANNOTATION, TI_ID_ANNOTATION,
                                       TOKEN_ANNOTATION, TRY_NUMBER_ANNOTATION)

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


def _hostile_values() -> dict[str, tuple[str, ...]]:
    """Per annotation a fence reads, values it cannot read: those ``test_hostile_annotations`` throws
    at it (malformed UUIDs, 100 KB and empty strings, NULs, negative and huge numbers, a region
    before Airflow 3.4), as a fixed list, so that a step's drawn integers pick one."""
    from test_hostile_annotations import _LABEL_VALUE, _ODD, HUGE, _not_int32, _not_number_below, _not_uuid

    task_ids = ("", HUGE, "\x00", "x" * 251, "t1\x00", "t\x00" + "y" * 20)
    stamps = ("", "yesterday", "2026-01-01T00:00:00", "2026-13-01T00:00:00+00:00", "9" * 41, HUGE)
    values = {
        TI_ID_ANNOTATION: tuple(filter(_not_uuid, _ODD)),
        TOKEN_ANNOTATION: tuple(filter(_not_uuid, _ODD)),
        TRY_NUMBER_ANNOTATION: tuple(filter(_not_number_below(2**31), _ODD)),
        SCHEDULER_JOB_ANNOTATION: tuple(filter(_not_number_below(2**63), _ODD)) + ("sched-7",),
        "dag_id": task_ids, "task_id": task_ids, "run_id": task_ids,
        "map_index": tuple(filter(_not_int32, _ODD)),
        DEPLOYMENT_ANNOTATION: tuple(v for v in _ODD if not _LABEL_VALUE.fullmatch(v)),
        # a region names a dynamic region, which Airflow 3.3 has not: a UUID is unreadable too
        REGION_ANNOTATION: tuple(v for v in _ODD if v and _not_uuid(v)) + (str(uuid.UUID(int=7, version=4)),),
        SCHEDULER_STARTED_ANNOTATION: stamps,
    }
    return values


#: annotation -> values it cannot read; a hostile pod takes one.
HOSTILE: dict[str, tuple[str, ...]] = _hostile_values()


def make_pod(machine: Any, origin: str, *, same_address: bool = False, same_dag: bool = False,
             running: bool = False, field_: str | None = None, value: str | None = None, task_id: str = "t1",
             try_number: int = 1, creator_slot: Any = None, token_first: str | None = None) -> Pod:
    """Create the pod (as its own creator would have) and return its record. ``creator_slot``: the
    scheduler of ours whose job id another deployment's pod carries (default A), or which launched a
    hostile pod; ``token_first``: the first hex digit of a foreign pod's token (its name sorts by it)."""
    from fenced_k8s_lab.core import our_deployment

    rng = random.Random(len(machine.trace))  # names only; deterministic per sequence
    world = machine.world
    task = world.dag_id, task_id, world.run_id
    collides = False
    ti_id = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    token = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    if token_first:
        token = token_first + token[1:]
    launcher = None
    if origin == "foreign":
        url = our_url(machine)
        url = url.set(password="theirs") if same_address else url.set(host="their-db.internal", port=5432)
        stamp = their_deployment_id(url.render_as_string(hide_password=False), str(rng.getrandbits(63)))
        collides = stamp == our_deployment()
        if not same_dag:
            task = "their_dag", task_id, "scheduled__2026-01-01T00:00:00+00:00"
        creator = str((creator_slot or machine.slots[0]).sched.job_id)  # job ids of two DBs overlap
    elif origin == "hostile":  # a superseded launch of ours, by a live scheduler of ours
        stamp = machine.deployment_id()
        row = machine.rows()[task_id]
        ti_id, try_number = row.id, row.try_number
        job = creator_slot.sched.job
        creator = str(job.id)
        launcher = Launcher(job.id, job.start_date)
    else:
        stamp = our_deployment()
        creator = str(machine.legacy_job())
    launch = LaunchIdentity(ti_id=ti_id, token=token, try_number=try_number, scheduler_job_id=creator,
                            deployment=stamp, launcher=launcher)
    labels = {"kubernetes_executor": "True", "airflow-worker": creator, "dag_id": task[0], "task_id": task[1],
              "try_number": str(try_number), "run_id": _label(task[2])}
    annotations = {"dag_id": task[0], "task_id": task[1], "run_id": task[2], "try_number": str(try_number)}
    if origin != "tokenless":
        labels.update(launch.labels())
        annotations.update(launch.annotations())
    if origin == "hostile":
        annotations[field_] = value
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
    pod = Pod(name=name, origin=origin, task=task[1] if task[0] == world.dag_id else None, launch=launch.token
              if origin != "tokenless" else None, ti_id=launch.ti_id, creator=creator,
              phase="Running" if running else "Pending", collides=collides,
              protected=True)
    machine.pods[name] = pod
    return pod


def _dns(value: str) -> str:
    return value.lower().replace("_", "-")


def _label(value: str) -> str:
    from airflow.providers.cncf.kubernetes.pod_generator import make_safe_label_value

    return make_safe_label_value(value)
