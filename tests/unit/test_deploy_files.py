"""Static checks of the deployment files (Dockerfile, helm-values/, kind-config/).

Runs in CI without Docker, kind, kubectl or helm: it only parses files. What the values files
install is proven by rendering the official chart (tests/helm); the kind path itself
(tests/kind) needs a real cluster and is skipped elsewhere.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

from fenced_k8s_executor import names  # noqa: E402  (dependency-free module)

ROOT = Path(__file__).resolve().parents[2]
HELM_VALUES = ROOT / "helm-values"
KIND_CONFIG = ROOT / "kind-config"

#: Chart `executor` values for which the official chart binds the pod-launcher Role to the
#: scheduler's service account (templates/rbac/pod-launcher-rolebinding.yaml).
RBAC_RENDERING_EXECUTORS = {
    "LocalExecutor",
    "LocalKubernetesExecutor",
    "KubernetesExecutor",
    "CeleryKubernetesExecutor",
}
FENCED_FILES = ["fenced-ha.yaml", "fenced-production.yaml"]
HA_FILES = ["fenced-ha.yaml", "stock-ha.yaml", "fenced-production.yaml"]

ENV_NAME = "AIRFLOW__CORE__EXECUTOR"


def _executor_env(values: dict) -> list[str]:
    return [str(e.get("value")) for e in values.get("env") or [] if e.get("name") == ENV_NAME]


def _yaml_files() -> list[Path]:
    files = sorted(HELM_VALUES.glob("**/*.yaml")) + sorted(HELM_VALUES.glob("**/*.yml"))
    files += sorted(KIND_CONFIG.glob("**/*.yaml")) + sorted(KIND_CONFIG.glob("**/*.yml"))
    return files


def _load(path: Path):
    with path.open() as fh:
        return yaml.safe_load(fh)


def _values(name: str) -> dict:
    data = _load(HELM_VALUES / name)
    assert isinstance(data, dict), f"{name}: top level must be a mapping"
    return data


def test_there_are_deploy_files():
    found = {p.relative_to(ROOT).as_posix() for p in _yaml_files()}
    for required in [
        "helm-values/fenced-ha.yaml",
        "helm-values/stock-ha.yaml",
        "helm-values/fenced-production.yaml",
        "kind-config/cluster.yaml",
        "kind-config/pending-pressure/quota.yaml",
    ]:
        assert required in found


@pytest.mark.parametrize("path", _yaml_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_yaml_parses(path: Path):
    with path.open() as fh:
        docs = [d for d in yaml.safe_load_all(fh) if d is not None]
    assert docs, f"{path} is empty"


@pytest.mark.parametrize("name", HA_FILES)
def test_chart_executor_keeps_the_scheduler_pod_rbac(name: str):
    values = _values(name)
    # The chart binds the pod-launcher Role to the scheduler only when a whole comma-separated
    # entry of `executor` is one it knows; its NOTES.txt refuses a different config.core.executor.
    assert values.get("executor") == "KubernetesExecutor", f"{name}: executor={values.get('executor')!r}"
    assert "KubernetesExecutor" in RBAC_RENDERING_EXECUTORS
    core = values.get("config", {}).get("core", {})
    assert "executor" not in core, f"{name}: set the executor through `env`, not config.core.executor"


@pytest.mark.parametrize("name", FENCED_FILES)
def test_fenced_values_load_the_class_through_env(name: str):
    assert _executor_env(_values(name)) == [names.EXECUTOR_CLASS_PATH]


def test_stock_values_do_not_override_the_executor():
    assert _executor_env(_values("stock-ha.yaml")) == []


def test_rollout_overlays():
    rollout = HELM_VALUES / "rollout"
    assert _executor_env(_load(rollout / "package-only.yaml")) == []
    assert "env" in _load(rollout / "package-only.yaml")  # replaces the base file's list
    assert _load(rollout / "enforce.yaml")["config"][names.CONFIG_SECTION]["mode"] == "enforce"
    assert _load(rollout / "mode-off.yaml")["config"][names.CONFIG_SECTION]["mode"] == "off"


def test_executor_class_path_is_importable():
    module_name, _, class_name = names.EXECUTOR_CLASS_PATH.rpartition(".")
    module = importlib.import_module(module_name)
    cls = getattr(module, class_name)
    from airflow.providers.cncf.kubernetes.executors.kubernetes_executor import KubernetesExecutor

    assert issubclass(cls, KubernetesExecutor)


def test_stock_and_fenced_ha_differ_only_in_executor_and_section():
    stock, fenced = _values("stock-ha.yaml"), _values("fenced-ha.yaml")
    assert names.CONFIG_SECTION not in stock["config"]
    assert names.CONFIG_SECTION in fenced["config"]

    def normalise(values: dict) -> dict:
        values = {**values, "config": {k: dict(v) for k, v in values["config"].items()}}
        values["config"].pop(names.CONFIG_SECTION, None)
        values["env"] = [e for e in values.get("env") or [] if e.get("name") != ENV_NAME]
        return values

    assert normalise(stock) == normalise(fenced)


@pytest.mark.parametrize("name", HA_FILES)
def test_ha_files_run_two_schedulers(name: str):
    assert int(_values(name)["scheduler"]["replicas"]) >= 2


@pytest.mark.parametrize("name", FENCED_FILES)
def test_fenced_section_is_accepted_by_the_executor_config_parser(name: str):
    config = pytest.importorskip("fenced_k8s_executor.config")
    section = _values(name)["config"][names.CONFIG_SECTION]
    assert isinstance(section, dict) and section
    unknown = set(section) - set(config.OPTIONS)
    assert not unknown, f"{name}: unknown [{names.CONFIG_SECTION}] options {sorted(unknown)}"
    config.parse({k: str(v) for k, v in section.items()})  # raises FencedConfigError when invalid


def test_production_starts_in_audit_mode_with_metrics():
    values = _values("fenced-production.yaml")
    assert values["config"][names.CONFIG_SECTION]["mode"] == "audit"
    assert values.get("statsd", {}).get("enabled") is True
    # No reproduction shortcuts in the production example.
    assert "task_queued_timeout" not in values["config"].get("scheduler", {})
    assert "delete_worker_pods" not in values["config"].get("kubernetes_executor", {})
    # External database; the chart's pgbouncer would point at the absent bundled one.
    assert values["postgresql"]["enabled"] is False and values["data"]["metadataSecretName"]
    assert values["pgbouncer"]["enabled"] is False or values["pgbouncer"].get("configSecretName")


def test_production_turns_psycopg_3_preparation_off():
    """Issue 59 item 9: ``[database] sql_alchemy_connect_args`` names a dict of the values'
    ``airflowLocalSettings`` (the chart mounts it as ``airflow_local_settings.py``) that sets
    ``prepare_threshold`` None: Airflow 3.3 does not, and behind a pooler in transaction mode
    psycopg 3's prepared statements collide (tests/integration/test_psycopg_behind_pgbouncer.py)."""
    values = _values("fenced-production.yaml")
    module, _, name = values["config"]["database"]["sql_alchemy_connect_args"].rpartition(".")
    assert module == "airflow_local_settings"
    scope: dict = {}
    exec(compile(values["airflowLocalSettings"], "airflow_local_settings.py", "exec"), scope)
    assert scope[name] == {"prepare_threshold": None}


def test_production_image_tag_follows_the_version():
    """`<airflow>-fenced-<version>` in the production values and the docs that build it, and the
    version has its CHANGELOG entry: one number names one build."""
    import fenced_k8s_executor

    version = fenced_k8s_executor.__version__
    images = _values("fenced-production.yaml")["images"]
    tags = {images["airflow"]["tag"], images["pod_template"]["tag"]}
    assert tags == {f"3.3.2-fenced-{version}"}
    for doc in ("docs/helm.md", "README.md"):
        found = set(re.findall(r"\d+\.\d+\.\d+-fenced-[0-9.]+\d", (ROOT / doc).read_text()))
        assert found == tags, f"{doc} names {found}"
    assert f"\n## {version}\n" in (ROOT / "CHANGELOG.md").read_text()


def test_kind_values_keep_evidence_and_expose_the_api_server():
    cluster = _load(KIND_CONFIG / "cluster.yaml")
    host_ports = {
        m["containerPort"]: m
        for node in cluster["nodes"]
        for m in node.get("extraPortMappings", [])
    }
    for name in ["fenced-ha.yaml", "stock-ha.yaml"]:
        values = _values(name)
        assert str(values["config"]["kubernetes_executor"]["delete_worker_pods"]) == "False"
        service = values["apiServer"]["service"]
        assert service["type"] == "NodePort"
        node_ports = {p.get("nodePort") for p in service["ports"]}
        assert node_ports & set(host_ports), f"{name}: api-server nodePort not mapped by kind"
        assert values["images"]["airflow"]["repository"] == "fenced-k8s-executor"


def _dockerfile_from_images(text: str) -> list[str]:
    args: dict[str, str] = {}
    images = []
    for line in text.splitlines():
        line = line.strip()
        if m := re.match(r"ARG\s+(\w+)=(\S+)", line):
            args.setdefault(m.group(1), m.group(2))
        elif m := re.match(r"FROM\s+(?:--\S+\s+)*(\S+)", line, re.IGNORECASE):
            image = re.sub(r"\$\{?(\w+)\}?", lambda a: args.get(a.group(1), a.group(0)), m.group(1))
            images.append(image)
    return images


def test_dockerfile_builds_on_airflow_33_and_installs_the_package():
    text = (ROOT / "Dockerfile").read_text()
    images = _dockerfile_from_images(text)
    assert images and re.fullmatch(r"apache/airflow:3\.3\.\d+(-python3\.\d+)?", images[0]), images
    copy = re.search(r"^COPY\s+(?:--\S+\s+)*dist/(fenced_k8s_executor-\S+\.whl)\s.*\s(\S+/)\s*$", text, re.MULTILINE)
    assert copy, "the Dockerfile must COPY the wheel built into dist/ (the README's recipe: tests/image)"
    pip = [ln for ln in text.splitlines() if "pip install" in ln]
    assert any("--no-cache-dir" in ln and copy.group(2) + copy.group(1) in ln for ln in pip), pip
    assert re.search(r"^USER\s+airflow\s*$", text, re.MULTILINE)


def test_kind_cluster_binds_the_api_server_to_localhost():
    cluster = _load(KIND_CONFIG / "cluster.yaml")
    assert cluster["networking"]["apiServerAddress"] == "127.0.0.1"
    roles = [n["role"] for n in cluster["nodes"]]
    assert roles.count("control-plane") == 1 and roles.count("worker") == 2
    for node in cluster["nodes"]:
        for mapping in node.get("extraPortMappings", []):
            assert mapping.get("listenAddress") == "127.0.0.1"


def test_quota_limits_pods():
    quota = _load(KIND_CONFIG / "pending-pressure" / "quota.yaml")
    assert quota["kind"] == "ResourceQuota"
    assert "pods" in quota["spec"]["hard"]


@pytest.mark.parametrize(
    "script", ["up.sh", "down.sh", "pending-pressure/taint.sh"], ids=lambda s: s
)
def test_scripts_are_strict(script: str):
    text = (KIND_CONFIG / script).read_text()
    assert text.startswith("#!/usr/bin/env bash")
    assert "set -euo pipefail" in text


def test_up_sh_installs_the_values_files_unchanged():
    """kind installs what CI renders (tests/helm): same chart source, same values, no --set."""
    text = (KIND_CONFIG / "up.sh").read_text()
    assert 'VALUES="${ROOT}/helm-values/${FLAVOUR}-ha.yaml"' in text
    helm = text[text.index("helm upgrade --install"):]
    helm = helm[: helm.index("--wait")]
    assert "--set" not in helm
    assert '--values "${VALUES}"' in helm
    assert 'CHART_DIR="${CHART_DIR:-${ROOT}/../shared/helm/chart}"' in text
    assert "postgres.yaml" in text
    for flavour in ["stock", "fenced"]:
        assert (HELM_VALUES / f"{flavour}-ha.yaml").exists()


DOCS = ["README.md", "docs/helm.md", "docs/kind.md"]


@pytest.mark.parametrize("doc", DOCS)
def test_docs_do_not_recommend_the_refused_route(doc: str):
    """config.core.executor different from `executor` does not render (chart NOTES.txt guard)."""
    text = (ROOT / doc).read_text()
    refused = re.compile(r"^\s*core:\s*\n\s+executor:\s*fenced_k8s_executor", re.MULTILINE)
    assert not refused.search(text), f"{doc} shows config.core.executor set to the class path"
    assert "1.22.0" not in text, f"{doc} still names the unverified chart 1.22.0"
