"""The import-time checks look at the provider's classes, where a missing hook is missing (our
subclass defines its overrides, so checking it would always pass), and the version policy of
docs/versions.md: refuse what the fences cannot work with or what is older than supported, warn on
a newer untested release that passes every check. ``provider_compat`` is checked against the
installed provider (the CI matrix runs this file on 10.23.0 and 10.25.0)."""

from __future__ import annotations

import inspect
import logging
import types
from importlib.metadata import version

import pytest
from packaging.version import Version

from airflow.executors.base_executor import BaseExecutor
from airflow.providers.cncf.kubernetes.executors.kubernetes_executor import KubernetesExecutor
from airflow.providers.cncf.kubernetes.executors.kubernetes_executor_utils import (
    AirflowKubernetesScheduler,
    KubernetesJobWatcher,
)

from fenced_k8s_executor import compat, provider_compat

PROVIDER = version("apache-airflow-providers-cncf-kubernetes")
AIRFLOW = version("apache-airflow-core")


def check(executor=KubernetesExecutor, base=BaseExecutor, scheduler=AirflowKubernetesScheduler,
          watcher=KubernetesJobWatcher, **versions):
    return compat.check(executor, base, scheduler, watcher, **versions)


def test_the_installed_combination_is_supported_and_tested(caplog):
    with caplog.at_level(logging.WARNING, logger="fenced_k8s_executor"):
        support = check()
    assert support == compat.Support(AIRFLOW, PROVIDER, ())
    assert support.warning is None and not caplog.records


@pytest.mark.parametrize("hook", list(compat.REQUIRED_EXECUTOR_HOOKS))
def test_a_provider_without_an_overridden_hook_fails_naming_it(hook):
    renamed = type("OlderKubernetesExecutor", (KubernetesExecutor,), {hook: None})
    with pytest.raises(compat.IncompatibleProviderError, match=f"{hook} is missing"):
        check(renamed)


def test_a_hook_that_no_longer_takes_the_fences_arguments_fails_naming_it():
    def _change_state(self, results):  # the session became positional-only elsewhere, say
        raise AssertionError

    changed = type("NewerKubernetesExecutor", (KubernetesExecutor,), {"_change_state": _change_state})
    with pytest.raises(compat.IncompatibleProviderError, match=r"_change_state\(self, results\) does not take"):
        check(changed)


@pytest.mark.parametrize("hook", list(compat.REQUIRED_SCHEDULER_HOOKS))
def test_a_scheduler_without_a_wrapped_hook_fails_naming_it(hook):
    renamed = type("OlderScheduler", (AirflowKubernetesScheduler,), {hook: None})
    with pytest.raises(compat.IncompatibleProviderError, match=f"AirflowKubernetesScheduler.{hook} is missing"):
        check(scheduler=renamed)


@pytest.mark.parametrize("hook", list(compat.REQUIRED_WATCHER_HOOKS))
def test_a_watcher_without_an_overridden_hook_fails_naming_it(hook):
    renamed = type("OlderWatcher", (KubernetesJobWatcher,), {hook: None})
    with pytest.raises(compat.IncompatibleProviderError, match=f"KubernetesJobWatcher.{hook} is missing"):
        check(watcher=renamed)


def test_a_watcher_that_drops_a_constructor_argument_fails_naming_it():
    def __init__(self, namespace, watcher_queue, resource_version, scheduler_job_id):
        raise AssertionError

    changed = type("NewerWatcher", (KubernetesJobWatcher,), {"__init__": __init__})
    with pytest.raises(compat.IncompatibleProviderError, match="does not take kube_config"):
        check(watcher=changed)


def test_a_core_that_does_not_pre_assign_the_token_fails_naming_the_versions():
    older_base = type("BaseExecutor", (), {})  # as on Airflow 3.2.0-3.2.1
    with pytest.raises(compat.IncompatibleProviderError) as raised:
        check(base=older_base)
    message = str(raised.value)
    assert "pre_assigns_external_executor_id is missing" in message
    assert f"Installed: apache-airflow {AIRFLOW}, apache-airflow-providers-cncf-kubernetes {PROVIDER}" in message
    assert f"supported: apache-airflow {compat.SUPPORTED_AIRFLOW}" in message
    assert f"apache-airflow-providers-cncf-kubernetes {compat.SUPPORTED_PROVIDER}" in message


def test_uuid_executor_keys_are_taken_where_core_makes_them():
    """Airflow 3.4's BaseExecutor.get_task_key turns the provider's UUID keys on: accepted then, and
    refused (naming the missing hook) on a core without it, where the keys could not be made."""
    uuid_keyed = type("UuidKubernetesExecutor", (KubernetesExecutor,), {"supports_task_instance_uuid": True})
    if hasattr(BaseExecutor, "get_task_key"):
        assert check(uuid_keyed).untested == ()
    else:
        with pytest.raises(compat.IncompatibleProviderError, match="get_task_key is missing"):
            check(uuid_keyed)


@pytest.mark.parametrize("versions, named", [
    ({"airflow_version": "3.2.1"}, "apache-airflow 3.2.1 is older than the first supported release 3.2.2"),
    ({"airflow_version": "3.1.8"}, "apache-airflow 3.1.8 is older"),
    ({"provider_version": "10.22.0"},
     "apache-airflow-providers-cncf-kubernetes 10.22.0 is older than the first supported release 10.23.0"),
])
def test_an_older_release_is_refused_naming_installed_and_supported_versions(versions, named):
    with pytest.raises(compat.IncompatibleProviderError) as raised:
        check(**versions)
    message = str(raised.value)
    assert named in message
    installed = versions.get("airflow_version", AIRFLOW), versions.get("provider_version", PROVIDER)
    assert f"Installed: apache-airflow {installed[0]}, apache-airflow-providers-cncf-kubernetes {installed[1]}" in message
    assert compat.SUPPORTED_AIRFLOW in message and compat.SUPPORTED_PROVIDER in message


@pytest.mark.parametrize("versions, named", [
    ({"provider_version": "10.26.0"}, "apache-airflow-providers-cncf-kubernetes 10.26.0 (tested: 10.23.0, 10.24.0, 10.25.0)"),
    ({"provider_version": "11.0.0"}, "apache-airflow-providers-cncf-kubernetes 11.0.0"),
    ({"airflow_version": "3.5.0"}, "apache-airflow 3.5.0 (tested: 3.2.2, 3.3.2, 3.4.0b2) is newer"),
    ({"airflow_version": "3.5.0rc1"}, "apache-airflow 3.5.0rc1"),
])
def test_a_newer_release_with_every_hook_runs_with_a_loud_warning(caplog, versions, named):
    with caplog.at_level(logging.WARNING, logger="fenced_k8s_executor"):
        support = check(**versions)
    assert support.untested and named in support.warning
    assert "UNTESTED" in support.warning
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [support.warning]


def test_a_newer_release_missing_a_hook_is_refused_not_warned():
    renamed = type("NewerKubernetesExecutor", (KubernetesExecutor,), {"_should_create_pod_for_job": None})
    with pytest.raises(compat.IncompatibleProviderError, match="10.26.0"):
        check(renamed, provider_version="10.26.0")


@pytest.mark.parametrize("versions", [{"provider_version": "10.25.1rc1"}, {"airflow_version": "3.4.0b2"},
                                      {"airflow_version": "3.4.0rc1"}, {"airflow_version": "3.4.0"}])
def test_prereleases_within_the_range_are_supported(versions):
    """3.4 is supported from its betas (tested on 3.4.0b2): silent, like any release in the range."""
    assert check(**versions).untested == ()


def test_the_executor_module_checks_the_provider_classes():
    from fenced_k8s_executor import executor

    assert "compat.check(KubernetesExecutor, BaseExecutor, AirflowKubernetesScheduler, KubernetesJobWatcher)" in (
        inspect.getsource(executor))
    assert executor.SUPPORT == compat.Support(AIRFLOW, PROVIDER, ())


# ---------------------------------------------------------------- provider_compat


def _kube_scheduler(**extra):
    return types.SimpleNamespace(watcher_queue="queue", scheduler_job_id="7", kube_config="config", **extra)


def test_watcher_arguments_follow_the_installed_provider():
    """Read off the wheels: 10.24.0 added supports_task_instance_uuid and team_name to the watcher."""
    kwargs = provider_compat.watcher_kwargs(_kube_scheduler(supports_task_instance_uuid=False, team_name="a"),
                                            "ns", "0")
    optional = {"supports_task_instance_uuid", "team_name"} if Version(PROVIDER) >= Version("10.24.0") else set()
    assert set(kwargs) == set(provider_compat.REQUIRED_WATCHER_ARGS) | optional
    assert kwargs["namespace"] == "ns" and kwargs["resource_version"] == "0" and kwargs["scheduler_job_id"] == "7"
    from fenced_k8s_executor.watching import ResilientJobWatcher

    watcher = ResilientJobWatcher(**kwargs)  # built, not started
    assert watcher.namespace == "ns" and watcher.scheduler_job_id == "7"
    if optional:
        assert watcher.team_name == "a"


def test_watcher_arguments_of_a_release_whose_watcher_takes_only_the_core_ones():
    def __init__(self, namespace, watcher_queue, resource_version, scheduler_job_id, kube_config):
        pass

    core_only = type("Watcher1023", (KubernetesJobWatcher,), {"__init__": __init__})
    kwargs = provider_compat.watcher_kwargs(_kube_scheduler(team_name="a"), "ns", None, core_only)
    assert set(kwargs) == set(provider_compat.REQUIRED_WATCHER_ARGS)
    assert provider_compat.missing_watcher_args(core_only) == []


def test_optional_watcher_arguments_default_when_the_scheduler_lacks_them():
    def __init__(self, namespace, watcher_queue, resource_version, scheduler_job_id, kube_config,
                 supports_task_instance_uuid=False, team_name=None):
        pass

    both = type("Watcher1025", (KubernetesJobWatcher,), {"__init__": __init__})
    kwargs = provider_compat.watcher_kwargs(_kube_scheduler(), "ns", None, both)
    assert kwargs["supports_task_instance_uuid"] is False and kwargs["team_name"] is None


# ---------------------------------------------------------------- provider_compat: Airflow 3.4


def _ti(**fields):
    base = dict(id="0190f0aa-0000-7000-8000-000000000001", dag_id="d", task_id="t", run_id="r", try_number=1,
                map_index=-1)
    base.update(fields)
    from airflow.models.taskinstancekey import TaskInstanceKey

    ti = types.SimpleNamespace(**base)
    ti.key = TaskInstanceKey(ti.dag_id, ti.task_id, ti.run_id, ti.try_number, provider_compat.stored_index(ti))
    return ti


def test_executor_keys_are_the_providers_own():
    """Read off the wheels: provider 10.24+ keys by TaskInstanceUuid where core has get_task_key (3.4)."""
    import uuid

    executor = KubernetesExecutor.__new__(KubernetesExecutor)  # no I/O, no config: only the key methods
    ti = _ti(id=uuid.UUID("0190f0aa-0000-7000-8000-000000000001"))
    key = provider_compat.executor_key(executor, ti)
    if getattr(KubernetesExecutor, "supports_task_instance_uuid", False):
        from airflow.executors.workloads.types import TaskInstanceUuid

        assert provider_compat.uuid_keys(executor) and key == TaskInstanceUuid(ti.id)
    else:
        assert not provider_compat.uuid_keys(executor) and key == ti.key


def test_queued_workloads_are_read_where_core_keeps_them():
    executor = KubernetesExecutor()
    queued = provider_compat.queued_workloads(executor)
    queued["k"] = "w"
    if hasattr(executor, "executor_queues"):  # 3.4: queued_tasks is a deprecated alias
        from airflow.executors.workloads import WorkloadType

        assert executor.executor_queues[WorkloadType.EXECUTE_TASK] == {"k": "w"}
    else:
        assert executor.queued_tasks == {"k": "w"}


def test_task_columns_are_the_stored_ones_of_the_installed_model():
    """3.4 stores the map index as region_index (map_index is an ORM synonym that
    ``__table__.c`` does not have) next to region_id, and marks the live attempt with working_set."""
    from airflow.models.taskinstance import TaskInstance

    columns = provider_compat.task_columns()
    names = set(TaskInstance.__table__.c.keys())
    if "working_set" in names:
        assert (columns.index.name, columns.region.name, columns.live.name) == (
            "region_index", "region_id", "working_set")
        assert provider_compat.live_attempt("ti") == " AND ti.working_set IS TRUE"
        assert provider_compat.live_attempt_clause() is not None
    else:
        assert columns.index.name == "map_index" and columns.region is None and columns.live is None
        assert provider_compat.live_attempt("ti") == "" and provider_compat.live_attempt_clause() is None
    assert all(c.table is TaskInstance.__table__ for c in (columns.dag_id, columns.task_id, columns.run_id))


def test_regions_and_stored_indexes():
    assert provider_compat.region_of(None) == provider_compat.region_of(provider_compat.SENTINEL_REGION) == ""
    region = "0190F0AA-0000-7000-8000-0000000000AB"
    assert provider_compat.region_of(region) == region.lower()
    assert provider_compat.region_param("") == provider_compat.SENTINEL_REGION
    assert provider_compat.stored_index(_ti(map_index=3)) == 3
    assert provider_compat.stored_index(_ti(map_index=-1, region_index=5)) == 5
    assert provider_compat.stored_index(_ti(map_index=None)) == -1
