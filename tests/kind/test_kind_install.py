"""The installed release loads what the values files say (tests/helm proves the same on the render).

The running scheduler answers for its own configuration, and the API server answers
`kubectl auth can-i` for the scheduler's service account: the runtime side of tests/helm's render
assertions, per flavour, on the chart as installed by conftest.py (values file + node overlay).
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from fenced_k8s_lab import hold
from fenced_k8s_executor.names import CONFIG_SECTION, EXECUTOR_CLASS_PATH

ROOT = Path(__file__).resolve().parents[2]
EXPECTED_EXECUTOR = {"stock": "KubernetesExecutor", "fenced": EXECUTOR_CLASS_PATH}
POD_VERBS = ("create", "get", "list", "watch", "patch", "delete")
CONF_SCRIPT = """
import json, sys
from airflow.configuration import conf
print("CONF:" + json.dumps({f"{s}.{o}": conf.get(s, o, fallback=None) for s, o in json.loads(sys.argv[1])}))
"""


def _config(installed, options: list[tuple[str, str]]) -> dict:
    """The scheduler's own resolution of ``options`` (env over airflow.cfg, as Airflow reads them)."""
    out = installed.cluster.run("exec", "-n", installed.namespace, "deploy/airflow-scheduler", "-c", "scheduler",
                                "--", "python", "-c", CONF_SCRIPT, json.dumps(options), timeout=180)
    line = next(ln for ln in out.splitlines() if ln.startswith("CONF:"))
    return json.loads(line[len("CONF:"):])


def test_scheduler_loads_what_the_values_file_says(installed):
    values = yaml.safe_load((ROOT / "helm-values" / f"{installed.flavour}-ha.yaml").read_text())
    overlay = yaml.safe_load((ROOT / "kind-config" / "node" / "values.yaml").read_text())
    fenced = values["config"].get(CONFIG_SECTION) or {}
    options = [("core", "executor"), ("kubernetes_executor", "worker_container_repository"),
               ("kubernetes_executor", "worker_container_tag")] + [(CONFIG_SECTION, o) for o in fenced]
    got = _config(installed, options)
    assert got["core.executor"] == EXPECTED_EXECUTOR[installed.flavour]
    for option, value in fenced.items():
        assert got[f"{CONFIG_SECTION}.{option}"] == str(value), option
    image = overlay["images"]["airflow"]  # the overlay's image replaces the values file's
    assert (got["kubernetes_executor.worker_container_repository"], got["kubernetes_executor.worker_container_tag"]) \
        == (image["repository"], image["tag"])


def test_scheduler_service_account_may_launch_pods(installed):
    cluster, ns = installed.cluster, installed.namespace
    account = cluster.run("get", "deploy/airflow-scheduler", "-n", ns, "-o",
                          "jsonpath={.spec.template.spec.serviceAccountName}").strip()
    replicas = int(cluster.run("get", "deploy/airflow-scheduler", "-n", ns, "-o", "jsonpath={.spec.replicas}"))
    assert replicas >= 2
    for verb in POD_VERBS:
        answer = cluster.run("auth", "can-i", verb, "pods", "-n", ns, f"--as=system:serviceaccount:{ns}:{account}",
                             check=False)
        assert answer.strip() == "yes", f"{account} may not {verb} pods: {answer}"


def test_components_tolerate_the_hold_and_workers_do_not(installed):
    """What lets the scenarios hold worker pods Pending while a recreated scheduler still schedules."""
    cluster, ns = installed.cluster, installed.namespace
    for kind in ("deploy", "statefulset"):
        for item in cluster.get(kind, ns)["items"]:
            tolerations = item["spec"]["template"]["spec"].get("tolerations") or []
            assert hold.TOLERATION in tolerations, (kind, item["metadata"]["name"], tolerations)
    template = yaml.safe_load(cluster.get("configmap", ns, "airflow-config")["data"]["pod_template_file.yaml"])
    assert not any(t.get("key") == hold.TAINT_KEY for t in template["spec"].get("tolerations") or [])
