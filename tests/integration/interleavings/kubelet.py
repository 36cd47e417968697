"""The node side of the checker: a kubelet that moves pod phases, and the worker each pod runs.

The kubelet does what a real one does to a pod, one step at a time: bind and start it, end it
(Succeeded or Failed, with the container reason a real runtime reports), and finish a graceful
deletion (the final delete, grace 0, uid precondition). The worker is the pod's program: its
first call is ``PATCH /execution/task-instances/{id}/run`` with the workload's own JWT, sent to
a real api-server app in process (``create_app``: the execution API with real JWT auth, and the
root middlewares plugins install, so the fenced run gate is in the path as it is in production).
What the pod does with the answer follows its program: the fenced entrypoint exits 0 on a stale
launch, the stock Task SDK exits 1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from fenced_k8s_executor.launch_claim import launch_claim_of, unverified_claims
from fenced_k8s_executor.names import SCHEDULER_JOB_ANNOTATION, TOKEN_ANNOTATION

FENCED_PROGRAM = "fenced_k8s_executor.worker"


@dataclass(frozen=True)
class Workload:
    """What a pod's args carry: the TI id its worker targets, its JWT, and which program runs it."""

    ti_id: str
    jwt: str
    fenced_program: bool


def workload_of(pod: Any) -> Workload | None:
    """The ``--json-string`` workload of an executor pod (None for a pod that carries none)."""
    for container in pod.spec.containers or []:
        args = list(container.args or []) + list(container.command or [])
        if "--json-string" not in args:
            continue
        body = json.loads(args[args.index("--json-string") + 1])
        program = " ".join(a for a in args if a != args[args.index("--json-string") + 1])
        return Workload(ti_id=str(body["ti"]["id"]), jwt=body["token"], fenced_program=FENCED_PROGRAM in program)
    return None


def launch_of(pod: Any) -> str | None:
    """The launch a pod belongs to, as the checker names launches: the fenced token annotation,
    else (a stock pod) the workload's JWT, which the scheduler minted for that one launch."""
    token = (pod.metadata.annotations or {}).get(TOKEN_ANNOTATION)
    if token:
        return token
    workload = workload_of(pod)
    return workload.jwt if workload is not None else None


def creator_of(pod: Any) -> str | None:
    annotations = pod.metadata.annotations or {}
    return annotations.get(SCHEDULER_JOB_ANNOTATION) or (pod.metadata.labels or {}).get("airflow-worker")


class Kubelet:
    """Pod phases as a kubelet reports them, through the world's kube client (user ``test``)."""

    def __init__(self, world: Any):
        self.world = world

    def start(self, name: str) -> None:
        self.world.set_pod_phase(name, "Running")

    def end(self, name: str, *, ok: bool, reason: str = "Error") -> None:
        self.world.set_pod_phase(name, "Succeeded" if ok else "Failed",
                                 container_reason="Completed" if ok else reason)

    def reap(self, pods: list) -> list[str]:
        """Finish graceful deletions (a bound pod with a deletionTimestamp): the container is
        stopped and the pod removed with grace 0 and a uid precondition. Returns the names."""
        from kubernetes.client import V1DeleteOptions, V1Preconditions
        from kubernetes.client.rest import ApiException

        done = []
        for pod in pods:
            if pod.metadata.deletion_timestamp and pod.spec.node_name:
                body = V1DeleteOptions(grace_period_seconds=0, preconditions=V1Preconditions(uid=pod.metadata.uid))
                try:
                    self.world.kube.delete_namespaced_pod(pod.metadata.name, self.world.namespace, body=body)
                except ApiException as error:
                    if error.status not in (404, 409):
                        raise
                done.append(pod.metadata.name)
        return done


@dataclass
class RunAnswer:
    status: int
    reason: str | None  # the run gate's or the route's reason, when it refused

    @property
    def won(self) -> bool:
        return self.status == 200


class Worker:
    """A pod's worker process talking to the execution API."""

    def __init__(self, client: Any, airflow: Any):
        self.client = client  # TestClient of the api-server app (gate + execution API)
        self.airflow = airflow  # the driver's in-process execution API, for /state

    def run(self, pod: Any) -> RunAnswer:
        workload = workload_of(pod)
        body = {"state": "running", "hostname": pod.metadata.name, "unixname": "airflow", "pid": 4242,
                "start_date": "2026-01-01T00:00:00+00:00"}
        resp = self.client.patch(f"/execution/task-instances/{workload.ti_id}/run", json=body,
                                 headers={"Authorization": f"Bearer {workload.jwt}"})
        reason = None
        if resp.status_code != 200:
            try:
                detail = resp.json().get("detail")
            except ValueError:
                detail = None
            reason = detail.get("reason") if isinstance(detail, dict) else str(detail)[:80]
        return RunAnswer(resp.status_code, reason)

    @staticmethod
    def exits_cleanly(pod: Any, answer: RunAnswer) -> bool:
        """Exit code 0 after a refused /run? Only the fenced entrypoint, and only for a stale launch
        (the gate's 409, or a 404 for its own claimed TI id); the stock SDK exits 1 on any refusal."""
        workload = workload_of(pod)
        if not workload.fenced_program:
            return False
        claims = unverified_claims(workload.jwt)
        if answer.status == 409 and answer.reason == "stale_executor_launch":
            return True
        return answer.status == 404 and launch_claim_of(claims) is not None and str(claims.get("sub")) == workload.ti_id

    def reschedule(self, ti_id: str) -> int:
        """A sensor in reschedule mode whose condition is not met: ``PATCH /state`` up_for_reschedule,
        as the Task SDK sends it (ready again at once)."""
        from airflow.utils import timezone

        now = timezone.utcnow().isoformat()
        body = {"state": "up_for_reschedule", "reschedule_date": now, "end_date": now}
        return self.airflow.api.patch(f"task-instances/{ti_id}/state", json=body).status_code

    def report(self, ti_id: str, state: str) -> int:
        """The task's outcome (``PATCH /state``): success, up_for_retry or failed."""
        from airflow.utils import timezone

        body: dict[str, Any] = {"state": state, "end_date": timezone.utcnow().isoformat()}
        if state == "success":
            body.update(task_outlets=[], outlet_events=[])
        return self.airflow.api.patch(f"task-instances/{ti_id}/state", json=body).status_code
