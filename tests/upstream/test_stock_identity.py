"""Executor gauges keep the stock KubernetesExecutor identity unless metrics_executor_name says otherwise."""

from __future__ import annotations

from unittest import mock

import pytest

from airflow.providers.cncf.kubernetes.executors.kubernetes_executor import KubernetesExecutor

from fenced_k8s_executor import FencedKubernetesExecutor, config

NAMES = "airflow.executors.base_executor.ExecutorLoader.get_executor_names"


def _gauge(**kwargs):
    """A patch of the gauge ``BaseExecutor._emit_metrics`` calls: the ``stats`` module's function
    on Airflow 3.3, ``Stats.gauge`` on 3.2 (both imported by airflow.executors.base_executor)."""
    from airflow.executors import base_executor

    stats = getattr(base_executor, "stats", None)
    if stats is not None and callable(getattr(stats, "gauge", None)):
        return mock.patch.object(stats, "gauge", **kwargs)
    return mock.patch.object(base_executor.Stats, "gauge", create=True, **kwargs)


def _gauges(executor, executors=1):
    with _gauge() as gauge, mock.patch(NAMES, return_value=[object()] * executors):
        executor._emit_metrics(4, 2, 1)
    # the executor's name tag: ``executor_class_name`` on Airflow 3.3, ``name`` on 3.2
    return {c.args[0]: c.kwargs["tags"].get("executor_class_name", c.kwargs["tags"].get("name"))
            for c in gauge.call_args_list}


@pytest.mark.parametrize("executors", [1, 2])
def test_fenced_reports_exactly_what_stock_reports(executors):
    assert _gauges(FencedKubernetesExecutor(), executors) == _gauges(KubernetesExecutor(), executors)


def test_several_executors_put_the_stock_name_in_the_metric_names():
    assert _gauges(FencedKubernetesExecutor(), executors=2) == {
        f"executor.{gauge}.KubernetesExecutor": "KubernetesExecutor"
        for gauge in ("open_slots", "queued_tasks", "running_tasks")
    }


def test_the_option_names_the_executor_and_the_class_is_restored():
    executor = FencedKubernetesExecutor()
    executor.fence = config.parse({"metrics_executor_name": "FencedKubernetesExecutor"})
    assert set(_gauges(executor, executors=2).values()) == {"FencedKubernetesExecutor"}
    executor.fence = config.parse({"metrics_executor_name": "K8sBlue"})
    assert set(_gauges(executor, executors=2)) == {f"executor.{g}.K8sBlue" for g in ("open_slots", "queued_tasks", "running_tasks")}
    assert type(executor) is FencedKubernetesExecutor


def test_class_is_restored_when_emitting_fails():
    executor = FencedKubernetesExecutor()
    with _gauge(side_effect=RuntimeError("statsd down")), pytest.raises(RuntimeError):
        executor._emit_metrics(1, 0, 0)
    assert type(executor) is FencedKubernetesExecutor


def test_option_default_and_validation():
    assert config.parse({}).metrics_executor_name == "KubernetesExecutor"
    assert config.parse({"metrics_executor_name": " Blue_K8s "}).metrics_executor_name == "Blue_K8s"
    for bad in ("", "  ", "kube executor", "1st", "a.b"):
        with pytest.raises(config.FencedConfigError, match=r"\[fenced_kubernetes_executor\] metrics_executor_name"):
            config.parse({"metrics_executor_name": bad})


def test_logger_keeps_the_real_class_name_when_first_used_by_the_gauges():
    executor = FencedKubernetesExecutor()
    assert executor._log is None
    _gauges(executor)
    assert executor._log._logger_factory_args == FencedKubernetesExecutor().log._logger_factory_args
