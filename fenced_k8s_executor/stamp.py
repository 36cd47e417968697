"""The launch identity on a pod the provider has built.

Applied after the provider's own build (pod template, then the task's ``pod_override``, then
``pod_mutation_hook``), as a few dict updates on the fresh ``V1Pod``. Passing the identity in
as a pod override instead made ``construct_pod`` run one more ``reconcile_pods`` per pod, whose
deep copies of kubernetes model objects cost about 40 % of a stock pod build.

Applied last, the identity cannot be undone by the user's customisation: our own labels and
annotations, the provider's ``task_instance_id`` annotation and ``ti_id`` label (Airflow 3.4's
provider finds a pod's attempt there, or in the stock worker's arguments, which the fenced worker
entrypoint's ``python -c`` bootstrap does not have; stamped on every release, so pods launched
before an upgrade to 3.4 carry it too), and the deterministic name (a hook that renames pods would defeat the
AlreadyExists recognition). The container program is replaced only while it is still the
provider's own ``execute_workload`` command: a pod whose program the user changed keeps it
(and runs without the launch gate, as stock would run it).
"""

from __future__ import annotations

from typing import Any

from fenced_k8s_executor.launch import LaunchIdentity
from fenced_k8s_executor.provider_compat import TASK_INSTANCE_ID_ANNOTATION, TASK_INSTANCE_ID_LABEL

#: The provider's worker program (``workload_to_command_args``), without the workload JSON.
STOCK_PROGRAM = ("python", "-m", "airflow.sdk.execution_time.execute_workload", "--json-string")
MAIN_CONTAINER = "base"


def main_container(pod: Any) -> Any | None:
    """The container that runs the task: ``base`` (the provider's name), else the first."""
    containers = list(getattr(pod.spec, "containers", None) or []) if pod.spec is not None else []
    for container in containers:
        if container.name == MAIN_CONTAINER:
            return container
    return containers[0] if containers else None


def runs_stock_program(container: Any) -> bool:
    args = list(container.args or [])
    return len(args) == len(STOCK_PROGRAM) + 1 and tuple(args[: len(STOCK_PROGRAM)]) == STOCK_PROGRAM


def stamp(pod: Any, launch: LaunchIdentity, name: str | None, program: list[str] | None) -> bool:
    """Give ``pod`` (in place) ``launch``'s labels and annotations, ``name`` when given, and
    ``program`` as its main container's args when it still runs the provider's program.
    Returns whether the program was replaced."""
    meta = pod.metadata
    meta.labels = {**(meta.labels or {}), **launch.labels(), TASK_INSTANCE_ID_LABEL: launch.ti_id}
    meta.annotations = {**(meta.annotations or {}), **launch.annotations(), TASK_INSTANCE_ID_ANNOTATION: launch.ti_id}
    if name:
        meta.name = name
    if program is None:
        return False
    container = main_container(pod)
    if container is None or not runs_stock_program(container):
        return False
    container.args = list(program)
    return True
