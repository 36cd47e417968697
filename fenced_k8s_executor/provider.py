"""Provider registration: makes ``airflow providers list`` show the package and
``airflow config list`` show the ``[fenced_kubernetes_executor]`` section with its defaults."""

from __future__ import annotations

from fenced_k8s_executor.config import OPTIONS
from fenced_k8s_executor.names import CONFIG_SECTION, DISTRIBUTION, EXECUTOR_CLASS_PATH


def get_provider_info() -> dict:
    from fenced_k8s_executor import __version__

    return {
        "package-name": DISTRIBUTION,
        "name": "Fenced Kubernetes Executor",
        "description": "KubernetesExecutor that fences stale worker pods under HA schedulers.",
        "versions": [__version__],
        "executors": [EXECUTOR_CLASS_PATH],
        # The `airflow kubernetes ...` commands come from the cncf-kubernetes provider already.
        "cli": ["fenced_k8s_executor.provider.get_cli_commands"],
        "config": {
            CONFIG_SECTION: {
                "description": "Launch-token fencing for fenced_k8s_executor.FencedKubernetesExecutor.",
                "options": {
                    name: {
                        "description": description,
                        "version_added": "0.1.0",
                        "type": "string",
                        "example": None,
                        "default": default,
                    }
                    for name, (default, description) in OPTIONS.items()
                },
            }
        },
    }


def get_cli_commands() -> list:
    """No commands of our own; declaring the hook keeps Airflow from importing the executor
    class in every CLI call to look for them."""
    return []
