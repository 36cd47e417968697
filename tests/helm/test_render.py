"""Every values file in helm-values/ rendered with the official Airflow chart (../shared/helm).

For each fenced values file the rendered manifests must show: the chart accepts the values; the
scheduler resolves ``[core] executor`` to the fenced class and the ``[fenced_kubernetes_executor]``
options the file sets (the real Airflow CLI reading the rendered airflow.cfg and the scheduler
container's env); the pod-launcher RoleBinding binds the scheduler's service account to pods
create/get/list/watch/patch/delete; >= 2 schedulers; the api-server and the worker pods run the
project image. Stock values files must still render. The rollout and rollback steps of
docs/helm.md (helm-values/rollout/*.yaml on top of fenced-production.yaml) must render too, and
the chart rules that docs/helm.md relies on are pinned by rendering them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fenced_k8s_executor import names

from helmrender import (
    HELM_VALUES,
    NAMESPACE,
    RELEASE,
    ROLLOUT,
    ROOT,
    STOCK_AIRFLOW_REPOSITORY,
    RenderError,
    chart_version,
    env_of,
    kind_image,
    local_settings,
    project_image,
)

yaml = pytest.importorskip("yaml")

#: The values files (witness-rbac.yaml is a manifest applied beside the chart, not values).
VALUES_FILES = sorted(p for p in HELM_VALUES.glob("*.yaml") if p.name != "witness-rbac.yaml")
FENCED = [p for p in VALUES_FILES if p.name.startswith("fenced-")]
STOCK = [p for p in VALUES_FILES if p.name.startswith("stock-")]
KIND_FILES = [p for p in VALUES_FILES if p.name.endswith("-ha.yaml")]  # installed by kind-config/up.sh
PRODUCTION = HELM_VALUES / "fenced-production.yaml"
POD_VERBS = {"create", "get", "list", "watch", "patch", "delete"}
FENCED_CLASS = names.EXECUTOR_CLASS_PATH
SECTION = names.CONFIG_SECTION

#: docs/helm.md section 4 and 5: (step, overlay on fenced-production.yaml or None, executor, mode).
ROLLOUT_STEPS = [
    ("1-package-only", ROLLOUT / "package-only.yaml", "KubernetesExecutor", None),
    ("2-audit", None, FENCED_CLASS, "audit"),
    ("3-enforce", ROLLOUT / "enforce.yaml", FENCED_CLASS, "enforce"),
    ("rollback-mode-off", ROLLOUT / "mode-off.yaml", FENCED_CLASS, "off"),
    ("rollback-stock", ROLLOUT / "package-only.yaml", "KubernetesExecutor", None),
]


def _ids(paths):
    return [p.name for p in paths]


@pytest.fixture(scope="session")
def kind_secrets(tmp_path_factory) -> Path:
    """A values file shaped like the secrets file kind-config/up.sh generates and passes."""
    text = (ROOT / "kind-config" / "up.sh").read_text()
    heredoc = re.search(r'cat >"\$\{SECRETS_FILE\}" <<YAML\n(.*?)\nYAML', text, re.DOTALL)
    assert heredoc, "kind-config/up.sh no longer writes the secrets file this test mirrors"
    keys = re.findall(r"^(\w+):", heredoc.group(1), re.MULTILINE)
    assert keys
    path = tmp_path_factory.mktemp("kind") / "secrets.yaml"
    path.write_text("".join(f'{k}: "placeholder-{k}"\n' for k in keys))
    return path


@pytest.fixture
def rendered_file(render, kind_secrets):
    """Render a values file the way it is installed (kind files with up.sh's secrets file)."""

    def _rendered(path: Path):
        return render(path, kind_secrets) if path in KIND_FILES else render(path)

    return _rendered


def _check_scheduler_can_launch_pods(rendered):
    scheduler = rendered.workload("scheduler")
    account = scheduler["spec"]["template"]["spec"]["serviceAccountName"]
    rendered.get("ServiceAccount", account)
    binding = rendered.get("RoleBinding", f"{RELEASE}-pod-launcher-rolebinding")
    subjects = {(s["kind"], s["name"], s.get("namespace")) for s in binding["subjects"] or []}
    assert ("ServiceAccount", account, NAMESPACE) in subjects, (
        f"the pod-launcher RoleBinding does not bind the scheduler's service account {account}: {subjects}"
    )
    role = rendered.get(binding["roleRef"]["kind"], binding["roleRef"]["name"])
    verbs = set()
    for rule in role["rules"]:
        if "" in rule.get("apiGroups", []) and "pods" in rule.get("resources", []):
            verbs |= set(rule["verbs"])
    assert POD_VERBS <= verbs, f"{role['metadata']['name']} grants pods {sorted(verbs)}"


def _check_images(rendered, values):
    image = project_image(values)
    assert not image.startswith(STOCK_AIRFLOW_REPOSITORY + ":"), f"images.airflow is the stock image {image}"
    api = rendered.container("api-server")
    assert api["image"] == image, f"api-server runs {api['image']}, not {image}"
    for where, container in rendered.airflow_containers():
        assert container["image"] == image, f"{where} runs {container['image']}, not {image}"
    base = [c for c in rendered.pod_template()["spec"]["containers"] if c["name"] == "base"]
    assert base and base[0]["image"] == image, f"worker pod template runs {base and base[0]['image']}"


# --------------------------------------------------------------------------- every values file


def test_values_files_are_classified():
    assert FENCED and STOCK
    assert set(FENCED) | set(STOCK) == set(VALUES_FILES), "name new values files fenced-* or stock-*"
    assert PRODUCTION in FENCED


@pytest.mark.parametrize("path", STOCK, ids=_ids(STOCK))
def test_stock_values_render_and_load_the_stock_executor(path, rendered_file, airflow_config):
    rendered = rendered_file(path)
    resolved = airflow_config(rendered)
    assert resolved["core.executor"] == "KubernetesExecutor"
    _check_scheduler_can_launch_pods(rendered)


@pytest.mark.parametrize("path", FENCED, ids=_ids(FENCED))
def test_fenced_values_render(path, rendered_file):
    rendered_file(path)  # raises RenderError with the chart's message


@pytest.mark.parametrize("path", FENCED, ids=_ids(FENCED))
def test_scheduler_loads_the_fenced_executor_with_the_intended_options(path, rendered_file, airflow_config):
    rendered = rendered_file(path)
    values = rendered.values
    resolved = airflow_config(rendered)
    assert resolved["core.executor"] == FENCED_CLASS
    intended = values["config"][SECTION]
    assert intended, f"{path.name} sets no [{SECTION}] options"
    for option, value in intended.items():
        assert resolved[f"{SECTION}.{option}"] == str(value), (
            f"[{SECTION}] {option}: the scheduler resolves {resolved[f'{SECTION}.{option}']!r}, "
            f"{path.name} says {value!r}"
        )
    # The executor's own parser accepts what Airflow hands it.
    config = pytest.importorskip("fenced_k8s_executor.config")
    config.parse({o: resolved[f"{SECTION}.{o}"] for o in intended})


@pytest.mark.parametrize("path", FENCED, ids=_ids(FENCED))
def test_scheduler_keeps_its_pod_rbac(path, rendered_file):
    _check_scheduler_can_launch_pods(rendered_file(path))


@pytest.mark.parametrize("path", FENCED + STOCK, ids=_ids(FENCED + STOCK))
def test_ha_schedulers(path, rendered_file):
    replicas = rendered_file(path).workload("scheduler")["spec"]["replicas"]
    assert int(replicas) >= 2


@pytest.mark.parametrize("path", FENCED + STOCK, ids=_ids(FENCED + STOCK))
def test_api_server_and_workers_run_the_project_image(path, rendered_file, airflow_config):
    rendered = rendered_file(path)
    _check_images(rendered, rendered.values)
    # Worker pods: the executor replaces the template's image with
    # [kubernetes_executor] worker_container_repository:tag and reads the template it mounts.
    resolved = airflow_config(rendered)
    image = project_image(rendered.values)
    worker = f"{resolved['kubernetes_executor.worker_container_repository']}:{resolved['kubernetes_executor.worker_container_tag']}"
    assert worker == image, f"worker pods would run {worker}, not {image}"
    mounts = {m["mountPath"] for m in rendered.container("scheduler").get("volumeMounts") or []}
    assert resolved["kubernetes_executor.pod_template_file"] in mounts


@pytest.mark.parametrize("path", KIND_FILES, ids=_ids(KIND_FILES))
def test_kind_files_use_the_image_up_sh_builds(path):
    values = yaml.safe_load(path.read_text())
    assert project_image(values) == kind_image()
    pod_template = values["images"]["pod_template"]
    assert f"{pod_template['repository']}:{pod_template['tag']}" == kind_image()


@pytest.mark.parametrize("path", VALUES_FILES, ids=_ids(VALUES_FILES))
def test_no_manifest_points_at_the_absent_bundled_database(path, rendered_file):
    """postgresql.enabled false: nothing may use the bundled <release>-postgresql host."""
    rendered = rendered_file(path)
    assert rendered.values.get("postgresql", {}).get("enabled") is False, f"{path.name}: use an external database"
    assert rendered.values.get("data", {}).get("metadataSecretName")
    host = re.compile(rf"\b{RELEASE}-postgresql\b")
    texts = dict(rendered.secret_texts())
    for cm in rendered.objects("ConfigMap"):
        for key, value in (cm.get("data") or {}).items():
            texts[f"configmap {cm['metadata']['name']}/{key}"] = str(value)
    bad = sorted(where for where, text in texts.items() if host.search(text))
    assert not bad, f"{path.name}: {bad} point at {RELEASE}-postgresql, which is not installed"


# --------------------------------------------------------------------------- rollout and rollback


@pytest.mark.parametrize(("step", "overlay", "executor", "mode"), ROLLOUT_STEPS, ids=[s[0] for s in ROLLOUT_STEPS])
def test_rollout_steps_render_and_load_what_the_docs_say(step, overlay, executor, mode, render, airflow_config):
    files = [PRODUCTION] + ([overlay] if overlay else [])
    rendered = render(*files)
    resolved = airflow_config(rendered)
    assert resolved["core.executor"] == executor
    if mode:
        assert resolved[f"{SECTION}.mode"] == mode
    _check_scheduler_can_launch_pods(rendered)
    _check_images(rendered, rendered.values)


def test_rollout_overlays_are_all_used():
    used = {s[1] for s in ROLLOUT_STEPS if s[1]}
    assert set(ROLLOUT.glob("*.yaml")) == used


# --------------------------------------------------------------------------- what the route is made of


@pytest.mark.parametrize("path", FENCED, ids=_ids(FENCED))
def test_every_airflow_process_and_the_worker_pods_get_the_fenced_executor(path, rendered_file):
    """The chart puts `env` on every Airflow container and on the worker pod template."""
    rendered = rendered_file(path)
    for where, container in rendered.airflow_containers():
        if "log-groomer" in container["name"]:
            continue  # shell loops, not Airflow processes: the chart gives them no `env`
        assert env_of(container).get("AIRFLOW__CORE__EXECUTOR") == FENCED_CLASS, where
    base = next(c for c in rendered.pod_template()["spec"]["containers"] if c["name"] == "base")
    entries = [e.get("value") for e in base["env"] if e["name"] == "AIRFLOW__CORE__EXECUTOR"]
    # The template's own entry (the chart's `executor`) comes first; the `env` entry is later and
    # wins (Kubernetes keeps the last value of a repeated name).
    assert entries == ["KubernetesExecutor", FENCED_CLASS], entries


def test_config_core_executor_override_is_refused_by_the_chart(render):
    """The old route: the chart's NOTES.txt guard fails the render (and `helm install`)."""
    with pytest.raises(RenderError, match="Please configure the executor with `executor`"):
        render(PRODUCTION, {"env": [], "config": {"core": {"executor": FENCED_CLASS}}})


def test_class_path_in_executor_leaves_the_scheduler_unbound(render):
    """The rejected alternative: the chart renders, but binds no pod RBAC to the scheduler."""
    rendered = render(PRODUCTION, {"env": [], "executor": FENCED_CLASS})
    with pytest.raises(AssertionError, match="does not bind the scheduler"):
        _check_scheduler_can_launch_pods(rendered)


@pytest.mark.parametrize("doc", ["README.md", "docs/helm.md", "docs/kind.md"])
def test_docs_name_the_chart_version_that_was_rendered(doc):
    """The docs say which chart CI renders; keep them true if ../shared/helm/chart changes."""
    assert chart_version() in (ROOT / doc).read_text(), f"{doc} does not name chart {chart_version()}"


def test_up_sh_chart_copy_renders_the_same_manifests(render, minihelm, kind_secrets, tmp_path):
    """kind-config/up.sh installs a copy of the chart without the (disabled, absent) postgresql
    dependency entry; docs/kind.md says it renders the same manifests. Same awk program as up.sh."""
    import shutil
    import subprocess

    from helmrender import CHART, NAMESPACE as NS, RELEASE as REL

    text = (ROOT / "kind-config" / "up.sh").read_text()
    program = re.search(r"awk '(/\^dependencies:/[^']*)'", text)
    assert program, "up.sh no longer strips the dependency with awk"
    copy = tmp_path / "chart"
    shutil.copytree(CHART, copy)
    for p in [copy, *copy.rglob("*")]:
        p.chmod(p.stat().st_mode | 0o200)
    stripped = subprocess.run(["awk", program.group(1), str(CHART / "Chart.yaml")], check=True,
                              capture_output=True, text=True).stdout
    assert "dependencies:" not in stripped and "name: airflow" in stripped
    (copy / "Chart.yaml").write_text(stripped)
    (copy / "Chart.lock").unlink(missing_ok=True)
    kind_values = HELM_VALUES / "fenced-ha.yaml"
    out = subprocess.run([str(minihelm), REL, str(copy), NS, "-f", str(kind_values), "-f", str(kind_secrets)],
                         check=True, capture_output=True, text=True).stdout

    def comparable(docs):
        # The chart generates a random redis password on every render (unused by KubernetesExecutor).
        return [d for d in docs if (d["metadata"].get("labels") or {}).get("component") != "redis"]

    ours = comparable([d for d in yaml.safe_load_all(out) if d])
    assert len(ours) > 20
    assert ours == comparable(render(kind_values, kind_secrets).docs)


NODE_OVERLAY = ROOT / "kind-config" / "node" / "values.yaml"  # what tests/node installs on ../shared/node


@pytest.mark.parametrize("path", KIND_FILES, ids=_ids(KIND_FILES))
def test_the_real_node_overlay_needs_nothing_the_node_lacks(path, render):
    """On a cluster with no registry and no StorageClass (../shared/node), every image is the
    imported project image and never pulled, no volume claim is made, and the executor is the
    values file's own; tests/node installs exactly this render."""
    rendered = render(path, NODE_OVERLAY)
    images = set()
    for doc in rendered.docs:
        spec = (doc.get("spec") or {}).get("template", {}).get("spec") or {}
        assert not (doc.get("spec") or {}).get("volumeClaimTemplates"), doc["metadata"]["name"]
        assert doc.get("kind") != "PersistentVolumeClaim", doc["metadata"]["name"]
        for ctr in spec.get("containers", []) + spec.get("initContainers", []):
            images.add(ctr["image"])
            assert ctr.get("imagePullPolicy") == "Never", (doc["metadata"]["name"], ctr["name"])
    assert images == {"localhost/fenced-k8s-executor:dev"}
    config = rendered.get("ConfigMap", f"{RELEASE}-config")["data"]["airflow.cfg"]
    assert "worker_container_repository = localhost/fenced-k8s-executor" in config
    assert "statsd_on = False" in config or "statsd_on" not in config


@pytest.mark.parametrize("path", KIND_FILES, ids=_ids(KIND_FILES))
def test_the_overlay_lets_the_hold_taint_hold_only_worker_pods(path, render):
    """tests/kind holds worker pods Pending with a NoSchedule taint (lab/fenced_k8s_lab/hold.py):
    every Airflow component tolerates it, so a scheduler recreated during the hold still schedules,
    and the worker pod template does not (the chart's global `tolerations` would reach it), nor
    does the overlay leave the values file's `env` behind (it adds through `extraEnv`)."""
    from fenced_k8s_lab.hold import TAINT_KEY, TOLERATION

    rendered = render(path, NODE_OVERLAY)
    workloads = [d for d in rendered.docs if d["kind"] in ("Deployment", "StatefulSet", "Job")]
    assert {d["metadata"]["name"] for d in workloads} >= {
        f"{RELEASE}-scheduler", f"{RELEASE}-api-server", f"{RELEASE}-dag-processor", f"{RELEASE}-triggerer",
        f"{RELEASE}-run-airflow-migrations"}
    for doc in workloads:
        assert TOLERATION in (doc["spec"]["template"]["spec"].get("tolerations") or []), doc["metadata"]["name"]
    template = yaml.safe_load(rendered.get("ConfigMap", f"{RELEASE}-config")["data"]["pod_template_file.yaml"])
    assert not any(t.get("key") == TAINT_KEY for t in template["spec"].get("tolerations") or [])
    env = {e["name"]: e.get("value") for e in template["spec"]["containers"][0]["env"]}
    assert env["FENCED_REPRO_WIDTH"] == "6"
    values_env = yaml.safe_load(path.read_text()).get("env") or []
    for entry in values_env:
        assert env[entry["name"]] == entry["value"]
    db = [d for d in yaml.safe_load_all((ROOT / "kind-config" / "postgres.yaml").read_text()) if d]
    (deploy,) = [d for d in db if d["kind"] == "Deployment"]
    assert TOLERATION in deploy["spec"]["template"]["spec"]["tolerations"]


# --------------------------------------------------------------------------- layered values files (issue 54)

TEAM_ENV = {"env": [{"name": "TEAM_SETTING", "value": "from-the-second-file"}]}


def _helm_md_layered_block() -> dict:
    """The values block docs/helm.md gives for layered files (its section's yaml block)."""
    section = (ROOT / "docs" / "helm.md").read_text().split("### Layered values files", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"^```yaml\n(.*?)^```", section, re.M | re.S)
    return yaml.safe_load(block)


def test_a_second_env_list_drops_the_override(render, airflow_config):
    """The trap: Helm replaces lists, so a second file's `env:` list loses AIRFLOW__CORE__EXECUTOR; the
    section stays (the stock scheduler warns that nothing reads it)."""
    rendered = render(PRODUCTION, TEAM_ENV)
    resolved = airflow_config(rendered)
    assert resolved["core.executor"] == "KubernetesExecutor"
    assert resolved[f"{SECTION}.mode"] == "audit"


def test_the_extra_env_override_survives_a_second_env_list(render, airflow_config):
    rendered = render(PRODUCTION, _helm_md_layered_block(), TEAM_ENV)
    assert airflow_config(rendered)["core.executor"] == FENCED_CLASS
    assert env_of(rendered.container("scheduler"))["TEAM_SETTING"] == "from-the-second-file"
    for where, container in rendered.airflow_containers():
        if "log-groomer" not in container["name"]:
            assert env_of(container).get("AIRFLOW__CORE__EXECUTOR") == FENCED_CLASS, where
    base = next(c for c in rendered.pod_template()["spec"]["containers"] if c["name"] == "base")
    assert env_of(base)["AIRFLOW__CORE__EXECUTOR"] == FENCED_CLASS  # extraEnv comes after the chart's own entry
    _check_scheduler_can_launch_pods(rendered)


def test_an_unquoted_mode_off_renders_false_and_is_refused_saying_to_quote_it(render, airflow_config, tmp_path):
    from fenced_k8s_executor import config

    overlay = tmp_path / "mode-off-unquoted.yaml"
    overlay.write_text("config:\n  fenced_kubernetes_executor:\n    mode: off\n")
    rendered_mode = airflow_config(render(PRODUCTION, overlay))[f"{SECTION}.mode"]
    assert rendered_mode.lower() == "false"
    with pytest.raises(config.FencedConfigError, match='quote it, mode: "off"'):
        config.parse({"mode": rendered_mode})
    assert airflow_config(render(PRODUCTION, ROLLOUT / "mode-off.yaml"))[f"{SECTION}.mode"] == "off"


def test_the_witness_rbac_binds_the_rendered_scheduler_exactly_the_lease_verbs_it_needs(render):
    """helm-values/witness-rbac.yaml, applied beside the chart as the node install applies it
    (``chart.witness_rbac``): it binds the ServiceAccount the chart gives the scheduler, and grants
    exactly what the witness does (create, patch) and `airflow fenced-k8s pods` reads (get), on
    leases only."""
    from fenced_k8s_lab.chart import witness_rbac
    from fenced_k8s_executor.witness import VERBS

    rendered = render(PRODUCTION)
    account = rendered.workload("scheduler")["spec"]["template"]["spec"]["serviceAccountName"]
    role, binding = witness_rbac(RELEASE, NAMESPACE)
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert role["rules"] == [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                              "verbs": ["get", "create", "patch"]}]
    assert set(VERBS) | {"get"} == set(role["rules"][0]["verbs"])


_CONNECT_ARGS = r"""
import json
from airflow import settings
from airflow.configuration import conf
print("@@FENCED_RESULT@@" + json.dumps({"connect_args": repr(conf.getimport("database", "sql_alchemy_connect_args")),
                                         "driver": settings.engine.dialect.driver}))
"""


@pytest.mark.parametrize("overlay", [None, ROLLOUT / "package-only.yaml"], ids=["2-audit", "1-package-only"])
def test_production_turns_psycopg_3_preparation_off_in_every_airflow_process(overlay, render, tmp_path):
    """Issue 59 item 9, what the chart makes of it: every Airflow component mounts the values'
    ``airflowLocalSettings`` where Airflow imports it from (``$AIRFLOW_HOME/config``), and the real
    Airflow, with the rendered ``airflow.cfg``, that file and the scheduler's env, builds its engine
    on psycopg 3 for the chart's plain ``postgresql://`` URL with ``prepare_threshold`` None. The
    stock executor's step too: its own engine needs it as much (tests/integration/test_psycopg_behind_pgbouncer.py)."""
    rendered = render(PRODUCTION) if overlay is None else render(PRODUCTION, overlay)
    for component in ("scheduler", "api-server", "dag-processor", "triggerer"):
        container = rendered.container(component)
        home = env_of(container).get("AIRFLOW_HOME", "/opt/airflow")
        mounted = {m["mountPath"] for m in container.get("volumeMounts") or []
                   if m.get("subPath") == "airflow_local_settings.py"}
        assert mounted == {f"{home}/config/airflow_local_settings.py"}, component
    home = tmp_path / "home"
    home.mkdir()
    (home / "airflow.cfg").write_text(rendered.airflow_cfg())
    local_settings(rendered, rendered.container("scheduler"), home)
    env = {k: v for k, v in os.environ.items() if not k.upper().lstrip("_").startswith("AIRFLOW")}
    env.update({k: v.replace("{AIRFLOW_HOME}", str(home)) for k, v in env_of(rendered.container("scheduler")).items()})
    env.update(AIRFLOW_HOME=str(home), AIRFLOW_CONFIG=str(home / "airflow.cfg"), HOME=str(home),
               # the URL's shape the chart's metadata secret holds (never connected to here)
               AIRFLOW__DATABASE__SQL_ALCHEMY_CONN="postgresql://airflow:placeholder@127.0.0.1:9/airflow")
    proc = subprocess.run([sys.executable, "-c", _CONNECT_ARGS], env=env, cwd=home, capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("@@FENCED_RESULT@@"))
    assert json.loads(line.removeprefix("@@FENCED_RESULT@@")) == {"connect_args": "{'prepare_threshold': None}",
                                                                 "driver": "psycopg"}
