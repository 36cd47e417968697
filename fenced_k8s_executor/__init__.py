"""fenced-k8s-executor: a drop-in KubernetesExecutor that fences stale worker pods under HA schedulers.

Import cost matters: Airflow imports this package for provider discovery in every process,
so the executor class (and its provider imports) load lazily on first attribute access, and so
does ``__version__``: it is the installed distribution's version, whose one source is
``pyproject.toml`` (``fenced_k8s_executor.build``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["FencedKubernetesExecutor", "__version__"]

if TYPE_CHECKING:
    from fenced_k8s_executor.executor import FencedKubernetesExecutor


def __getattr__(name: str) -> Any:
    if name == "__version__":
        from fenced_k8s_executor.build import version

        return version()
    if name == "FencedKubernetesExecutor":
        from fenced_k8s_executor.executor import FencedKubernetesExecutor

        return FencedKubernetesExecutor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
