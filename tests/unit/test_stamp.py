"""The launch identity stamped on pods built by the provider's own ``PodGenerator.construct_pod``."""

from __future__ import annotations

import uuid
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.client import models as k8s

from airflow.providers.cncf.kubernetes.pod_generator import PodGenerator

from fenced_k8s_executor import compat, stamp
from fenced_k8s_executor.launch import LaunchIdentity, from_pod_metadata, pod_name

STOCK_ARGS = [*stamp.STOCK_PROGRAM, '{"ti": {}}']
GATE_ARGS = ["python", "-c", "bootstrap", "--json-string", '{"ti": {}}']


def _launch(token: str | None = None) -> LaunchIdentity:
    return LaunchIdentity(ti_id=str(uuid.uuid4()), token=token or str(uuid.uuid4()), try_number=2,
                          scheduler_job_id="7", dag_id="d", task_id="t", run_id="r", deployment="dep")


def _built(override: k8s.V1Pod | None = None, hook=None, args=None) -> k8s.V1Pod:
    base = k8s.V1Pod(metadata=k8s.V1ObjectMeta(labels={"from-template": "yes"}),
                     spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="base", image="img")]))
    pod = PodGenerator.construct_pod(
        dag_id="d", task_id="t", pod_id="d-t-random", try_number=2, kube_image="img", date=None,
        args=list(args or STOCK_ARGS), pod_override_object=override, base_worker_pod=base, namespace="ns",
        scheduler_job_id="7", run_id="r",
    )
    if hook is not None:  # the provider calls pod_mutation_hook right after the merge
        hook(pod)
    return pod


def test_identity_wins_over_override_and_hook_and_keeps_everything_else():
    launch = _launch()
    override = k8s.V1Pod(metadata=k8s.V1ObjectMeta(labels={"team": "a"}, annotations={"note": "x"}),
                         spec=k8s.V1PodSpec(containers=[k8s.V1Container(
                             name="base", resources=k8s.V1ResourceRequirements(requests={"cpu": "1"}))]))

    def hook(pod):
        pod.metadata.name = "renamed-by-hook"
        pod.metadata.labels["hooked"] = "1"
        pod.metadata.labels.update(_launch().labels())  # a hook that copies another pod's identity

    pod = _built(override, hook)
    name = pod_name("d", "t", launch.token)
    assert stamp.stamp(pod, launch, name, GATE_ARGS)
    assert pod.metadata.name == name
    assert from_pod_metadata(pod.metadata.annotations) == launch
    assert {k: pod.metadata.labels[k] for k in launch.labels()} == launch.labels()
    assert pod.metadata.labels["team"] == "a" and pod.metadata.labels["hooked"] == "1"
    assert pod.metadata.labels["from-template"] == "yes" and pod.metadata.labels["airflow-worker"] == "7"
    assert pod.metadata.annotations["note"] == "x" and pod.metadata.annotations["dag_id"] == "d"
    container = stamp.main_container(pod)
    assert container.args == GATE_ARGS and container.resources.requests == {"cpu": "1"}


def test_a_program_the_user_changed_is_kept():
    pod = _built(args=["my-wrapper", *STOCK_ARGS])
    assert not stamp.stamp(pod, _launch(), None, GATE_ARGS)
    assert stamp.main_container(pod).args == ["my-wrapper", *STOCK_ARGS]


def test_no_program_and_no_name_leave_them_as_built():
    pod = _built()
    assert not stamp.stamp(pod, _launch(), None, None)
    assert pod.metadata.name == "d-t-random" and stamp.main_container(pod).args == STOCK_ARGS


def test_main_container_is_base_wherever_it_is():
    pod = k8s.V1Pod(spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="sidecar"), k8s.V1Container(name="base")]))
    assert stamp.main_container(pod).name == "base"
    assert stamp.main_container(k8s.V1Pod(spec=k8s.V1PodSpec(containers=[]))) is None


@given(labels=st.dictionaries(st.sampled_from(["a", "b", "fenced-k8s-executor.io/launch-token"]), st.text(max_size=5)),
       annotations=st.dictionaries(st.sampled_from(["x", "fenced-k8s-executor.io/ti-id"]), st.text(max_size=5)))
def test_stamped_identity_always_reads_back_and_user_keys_survive(labels, annotations):
    launch = _launch()
    pod = k8s.V1Pod(metadata=k8s.V1ObjectMeta(labels=dict(labels), annotations=dict(annotations)))
    stamp.stamp(pod, launch, None, None)
    # task coordinates come from the provider's own annotations, absent from this bare pod
    assert from_pod_metadata(pod.metadata.annotations) == replace(launch, dag_id=None, task_id=None, run_id=None)
    for key, value in labels.items():
        assert pod.metadata.labels[key] == launch.labels().get(key, value)
    for key, value in annotations.items():
        assert pod.metadata.annotations[key] == launch.annotations().get(key, value)


def test_missing_provider_hook_fails_at_import_naming_it():
    class Scheduler:
        run_next = run_next_batch = _make_kube_watcher = staticmethod(lambda *a: None)

    from airflow.executors.base_executor import BaseExecutor

    from fenced_k8s_executor.executor import FencedKubernetesExecutor

    with pytest.raises(compat.IncompatibleProviderError, match="AirflowKubernetesScheduler._build_pod_request"):
        compat.check(FencedKubernetesExecutor, BaseExecutor, Scheduler)


def test_every_stamped_pod_names_its_attempt_as_airflow_34s_provider_reads_it():
    """The fenced entrypoint's ``python -c`` bootstrap has no stock arguments to parse: the
    provider's task_instance_id annotation (and ti_id label) name the attempt, on every release,
    so a pod launched before an upgrade to 3.4 is found by 3.4's events and adoption."""
    from airflow.providers.cncf.kubernetes.executors import kubernetes_executor_types

    from fenced_k8s_executor import provider_compat

    launch = _launch()
    pod = _built()
    stamp.stamp(pod, launch, None, GATE_ARGS)
    assert pod.metadata.annotations[provider_compat.TASK_INSTANCE_ID_ANNOTATION] == launch.ti_id
    assert pod.metadata.labels[provider_compat.TASK_INSTANCE_ID_LABEL] == launch.ti_id
    read = getattr(kubernetes_executor_types, "task_instance_id_from_pod", None)  # provider 10.24+
    assert read is None or str(read(pod)) == launch.ti_id
