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
        # `airflow fenced-k8s ...`; the `airflow kubernetes ...` commands come from the cncf-kubernetes provider.
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
    """``airflow fenced-k8s ...`` (``fenced_k8s_executor.cli``). Declared here, in the provider's
    ``cli`` section, so that Airflow reads it without importing the executor class on every CLI
    call; the executor's ``get_cli_commands()`` returns the same group beside the provider's."""
    from fenced_k8s_executor.cli import commands

    return commands()
