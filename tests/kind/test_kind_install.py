"""The installed release is what CI rendered (tests/helm): same values file, same resolution.

kind-config/up.sh installs helm-values/<flavour>-ha.yaml unchanged. Here the running scheduler
answers `airflow config get-value` itself, and the API server answers `kubectl auth can-i` for the
scheduler's service account: the runtime side of tests/helm's render assertions.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fenced_k8s_executor.names import CONFIG_SECTION, EXECUTOR_CLASS_PATH

pytestmark = pytest.mark.kind

ROOT = Path(__file__).resolve().parents[2]
FLAVOURS = ("stock", "fenced")
EXPECTED_EXECUTOR = {"stock": "KubernetesExecutor", "fenced": EXECUTOR_CLASS_PATH}
POD_VERBS = ("create", "get", "list", "watch", "patch", "delete")

flavours = pytest.mark.parametrize("flavour_cluster", FLAVOURS, indirect=True, scope="module")


def _get_value(kindlib, release: str, section: str, option: str) -> str:
    out = kindlib.kubectl(
        "exec", f"deploy/{release}-scheduler", "-c", "scheduler", "--",
        "airflow", "config", "get-value", section, option, timeout=180,
    )
    lines = [ln for ln in out.stdout.splitlines() if ln.strip()]
    return lines[-1].strip() if lines else ""


@flavours
def test_scheduler_loads_what_the_values_file_says(flavour_cluster, kindlib):
    flavour = flavour_cluster
    release = kindlib.RELEASE
    values = yaml.safe_load((ROOT / "helm-values" / f"{flavour}-ha.yaml").read_text())
    assert _get_value(kindlib, release, "core", "executor") == EXPECTED_EXECUTOR[flavour]
    for option, value in (values["config"].get(CONFIG_SECTION) or {}).items():
        assert _get_value(kindlib, release, CONFIG_SECTION, option) == str(value), option
    image = f"{values['images']['airflow']['repository']}:{values['images']['airflow']['tag']}"
    repo = _get_value(kindlib, release, "kubernetes_executor", "worker_container_repository")
    tag = _get_value(kindlib, release, "kubernetes_executor", "worker_container_tag")
    assert f"{repo}:{tag}" == image


@flavours
def test_scheduler_service_account_may_launch_pods(flavour_cluster, kindlib):
    release = kindlib.RELEASE
    account = kindlib.kubectl(
        "get", f"deploy/{release}-scheduler", "-o", "jsonpath={.spec.template.spec.serviceAccountName}"
    ).stdout.strip()
    replicas = int(kindlib.kubectl("get", f"deploy/{release}-scheduler", "-o", "jsonpath={.spec.replicas}").stdout)
    assert replicas >= 2
    for verb in POD_VERBS:
        answer = kindlib.kubectl(
            "auth", "can-i", verb, "pods", f"--as=system:serviceaccount:{kindlib.NAMESPACE}:{account}", check=False
        )
        assert answer.stdout.strip() == "yes", f"{account} may not {verb} pods: {answer.stdout}{answer.stderr}"
