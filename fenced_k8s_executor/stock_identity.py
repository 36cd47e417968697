"""Executor metrics under the stock executor's name, so existing dashboards keep working.

``BaseExecutor._emit_metrics`` reports ``executor.open_slots``, ``executor.queued_tasks`` and
``executor.running_tasks`` with the tag ``executor_class_name=self.__class__.__name__``, and with
several executors configured it appends that name to the metric names as well
(``_get_metric_name``: ``executor.open_slots.KubernetesExecutor``). Swapping in
FencedKubernetesExecutor would silently rename those series.

:class:`StockMetricIdentity` keeps them as the stock executor reports them. It overrides
``_emit_metrics`` only, and only to call ``super()._emit_metrics`` while the instance's class is
a stand-in subclass named as configured (``[fenced_kubernetes_executor] metrics_executor_name``,
default ``KubernetesExecutor``). The stand-in subclasses the real class and adds nothing, so
every method and attribute resolves exactly as before; only ``__class__.__name__`` differs, for
the duration of that one call. Whatever upstream does with the name (tags, metric names, log
lines) keeps the stock identity, without copying any of its code.
"""

from __future__ import annotations

import functools
from typing import Any

from fenced_k8s_executor import config

OPTION = "metrics_executor_name"


@functools.lru_cache(maxsize=None)
def _stand_in(cls: type, name: str) -> type:
    """A subclass of ``cls`` that differs only by its name (cached: one per class and name)."""
    return type(cls)(name, (cls,), {"__module__": cls.__module__, "__qualname__": name,
                                      "__doc__": cls.__doc__})


class StockMetricIdentity:
    """Mixin for a KubernetesExecutor subclass: BaseExecutor's executor gauges keep the stock name."""

    @property
    def metrics_executor_name(self) -> str:
        """The executor name the executor gauges report: the option once started, else its default."""
        fence = getattr(self, "fence", None)
        name = getattr(fence, OPTION, None)
        return name or config.OPTIONS[OPTION][0]

    def _emit_metrics(self, open_slots: Any, num_running_tasks: Any, num_queued_tasks: Any) -> None:
        cls = type(self)
        name = self.metrics_executor_name
        if name == cls.__name__:
            return super()._emit_metrics(open_slots, num_running_tasks, num_queued_tasks)
        self.log  # noqa: B018 - bind the (cached) logger to the real class before the name changes
        self.__class__ = _stand_in(cls, name)
        try:
            return super()._emit_metrics(open_slots, num_running_tasks, num_queued_tasks)
        finally:
            self.__class__ = cls
