"""The import-time hook check looks at the provider's classes, where a missing hook is missing
(our subclass defines its overrides, so checking it would always pass)."""

from __future__ import annotations

import pytest

from fenced_k8s_executor import compat


def test_the_installed_provider_has_every_hook():
    from airflow.executors.base_executor import BaseExecutor
    from airflow.providers.cncf.kubernetes.executors.kubernetes_executor import KubernetesExecutor
    from airflow.providers.cncf.kubernetes.executors.kubernetes_executor_utils import AirflowKubernetesScheduler

    compat.check(KubernetesExecutor, BaseExecutor, AirflowKubernetesScheduler)


@pytest.mark.parametrize("hook", compat.REQUIRED_EXECUTOR_HOOKS)
def test_a_provider_without_an_overridden_hook_fails_naming_it(hook):
    from airflow.executors.base_executor import BaseExecutor
    from airflow.providers.cncf.kubernetes.executors.kubernetes_executor import KubernetesExecutor
    from airflow.providers.cncf.kubernetes.executors.kubernetes_executor_utils import AirflowKubernetesScheduler

    renamed = type("OlderKubernetesExecutor", (KubernetesExecutor,), {hook: None})
    with pytest.raises(compat.IncompatibleProviderError, match=hook):
        compat.check(renamed, BaseExecutor, AirflowKubernetesScheduler)


def test_the_executor_module_checks_the_provider_class():
    import inspect

    from fenced_k8s_executor import executor

    assert "compat.check(KubernetesExecutor," in inspect.getsource(executor)
