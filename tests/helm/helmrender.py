"""Render the official Airflow Helm chart with this repository's values files, offline (tests/helm).

The chart source and ``minihelm`` (the ``helm template`` pipeline of helm v3.21.4) live in the
read-only folder ``../shared/helm`` beside the repository (its README says what it is). When that
folder is absent, every test here is skipped with the reason. Nothing is downloaded: minihelm is
unpacked into pytest's temporary directory.

Helpers (fixtures ``render`` and ``airflow_config``):

* ``render(*values_files)`` -> :class:`Rendered`: the manifests, or :class:`RenderError` with
  the chart's message when the chart refuses the values (a template ``fail``, the schema).
* ``airflow_config(rendered)`` -> ``{"section.option": value}``: what the scheduler container
  resolves for ``[core] executor``, the worker image and pod template options and every
  ``[fenced_kubernetes_executor]`` option the values set, computed the way Airflow does. The rendered ConfigMap's
  ``airflow.cfg`` is written where the container mounts it (``$AIRFLOW_HOME/airflow.cfg``, mapped
  into a temporary directory), the container's ``env`` becomes the process environment (Kubernetes
  semantics: a repeated name keeps its last value; ``secretKeyRef`` values become placeholders),
  nothing ``AIRFLOW*`` leaks in from the test process, and the real Airflow CLI runs
  ``airflow config get-value SECTION OPTION`` for each pair. All pairs run in one interpreter
  (``airflow.__main__.main`` once per pair) so a render costs one Airflow start-up (~4 s).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
HELM_VALUES = ROOT / "helm-values"
ROLLOUT = HELM_VALUES / "rollout"
SHARED_HELM = ROOT.parent / "shared" / "helm"
CHART = SHARED_HELM / "chart"
INSTALL_SH = SHARED_HELM / "install.sh"
RELEASE = "airflow"
NAMESPACE = "airflow"

#: libyaml when available: parsing a render is ~10x faster than the pure-Python loader.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

#: The chart's default image; the project image must replace it everywhere.
STOCK_AIRFLOW_REPOSITORY = "apache/airflow"


def shared_helm_skip_reason() -> str | None:
    missing = [str(p) for p in (CHART / "Chart.yaml", INSTALL_SH) if not p.is_file()]
    if missing:
        return (
            f"official chart and minihelm not found beside the repository ({SHARED_HELM}); "
            f"missing: {', '.join(missing)}"
        )
    if shutil.which("xz") is None:
        return "xz not on PATH (needed by ../shared/helm/install.sh to unpack minihelm)"
    return None


def pytest_collection_modifyitems(config, items):
    ours = [item for item in items if HERE in Path(str(item.fspath)).resolve().parents]
    if not ours:
        return
    reason = shared_helm_skip_reason()
    if reason:
        for item in ours:
            item.add_marker(pytest.mark.skip(reason=reason))


def chart_version() -> str:
    return str(yaml.safe_load((CHART / "Chart.yaml").read_text())["version"])


# --------------------------------------------------------------------------- rendering


class RenderError(AssertionError):
    """The chart refused the values (``helm template`` exit 1)."""


@dataclass
class Rendered:
    files: tuple[Path, ...]
    docs: list[dict]
    values: dict = field(default_factory=dict)  # the values files merged (Helm: maps deep, lists replaced)

    def objects(self, kind: str) -> list[dict]:
        return [d for d in self.docs if d.get("kind") == kind]

    def get(self, kind: str, name: str) -> dict:
        found = [d for d in self.objects(kind) if d["metadata"]["name"] == name]
        assert found, f"no {kind} {name!r} rendered; {kind}s: {[d['metadata']['name'] for d in self.objects(kind)]}"
        return found[0]

    def workload(self, component: str) -> dict:
        """The Deployment or StatefulSet ``<release>-<component>``."""
        name = f"{RELEASE}-{component}"
        for kind in ("Deployment", "StatefulSet"):
            for d in self.objects(kind):
                if d["metadata"]["name"] == name:
                    return d
        raise AssertionError(f"no Deployment/StatefulSet {name!r} rendered")

    def container(self, component: str, container: str | None = None) -> dict:
        spec = self.workload(component)["spec"]["template"]["spec"]
        name = container or component
        found = [c for c in spec["containers"] if c["name"] == name]
        assert found, f"{component}: no container {name!r} in {[c['name'] for c in spec['containers']]}"
        return found[0]

    def airflow_cfg(self) -> str:
        return self.get("ConfigMap", f"{RELEASE}-config")["data"]["airflow.cfg"]

    def pod_template(self) -> dict:
        data = self.get("ConfigMap", f"{RELEASE}-config")["data"]
        assert "pod_template_file.yaml" in data, "the chart rendered no worker pod template"
        return yaml.safe_load(data["pod_template_file.yaml"])

    def airflow_containers(self) -> list[tuple[str, dict]]:
        """Every container and init container of every workload that runs Airflow (has AIRFLOW_HOME)."""
        out = []
        for kind in ("Deployment", "StatefulSet", "Job", "CronJob"):
            for d in self.objects(kind):
                spec = d["spec"]
                if kind == "CronJob":
                    spec = spec["jobTemplate"]["spec"]
                pod = spec["template"]["spec"]
                for c in pod.get("initContainers", []) + pod["containers"]:
                    if any(e["name"] == "AIRFLOW_HOME" for e in c.get("env") or []):
                        out.append((f"{kind}/{d['metadata']['name']}/{c['name']}", c))
        return out

    def secret_texts(self) -> dict[str, str]:
        """Decoded text of every rendered Secret value, keyed by ``secret/key``."""
        out = {}
        for s in self.objects("Secret"):
            for key, value in (s.get("data") or {}).items():
                out[f"{s['metadata']['name']}/{key}"] = base64.b64decode(value).decode(errors="replace")
            for key, value in (s.get("stringData") or {}).items():
                out[f"{s['metadata']['name']}/{key}"] = str(value)
        return out


def merge_values(base: dict, overlay: dict) -> dict:
    """Helm's merge of several -f files: maps merge recursively, everything else is replaced."""
    out = dict(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_values(out[key], value)
        else:
            out[key] = value
    return out


def env_of(container: dict) -> dict[str, str]:
    """The container's environment as Kubernetes builds it (a repeated name keeps its last value)."""
    env: dict[str, str] = {}
    for entry in container.get("env") or []:
        if "value" in entry:
            env[entry["name"]] = str(entry["value"])
        else:
            env[entry["name"]] = _placeholder(entry)
    return env


def _placeholder(entry: dict) -> str:
    ref = (entry.get("valueFrom") or {}).get("secretKeyRef") or {}
    if ref.get("key") == "connection":
        # A connection URL (metadata DB, AIRFLOW_CONN_*): a SQLite file that is never opened.
        return "sqlite:///{AIRFLOW_HOME}/placeholder.db"
    return f"placeholder-{ref.get('name', 'value')}-{ref.get('key', 'value')}"


@pytest.fixture(scope="session")
def minihelm(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("minihelm")
    out = subprocess.run(
        ["bash", str(INSTALL_SH), str(dest)], check=True, capture_output=True, text=True, timeout=120
    )
    path = Path(out.stdout.strip().splitlines()[-1])
    assert path.is_file(), out
    return path


@pytest.fixture(scope="session")
def render(minihelm, tmp_path_factory):
    cache: dict[tuple, Rendered | RenderError] = {}
    scratch = tmp_path_factory.mktemp("values")

    def _render(*files: Path | dict) -> Rendered:
        paths: list[Path] = []
        for i, f in enumerate(files):
            if isinstance(f, dict):  # inline values for the negative cases
                p = scratch / f"inline-{len(cache)}-{i}.yaml"
                p.write_text(yaml.safe_dump(f))
                f = p
            paths.append(Path(f))
        key = tuple((str(p), p.read_text()) for p in paths)
        if key not in cache:
            cmd = [str(minihelm), RELEASE, str(CHART), NAMESPACE]
            for p in paths:
                cmd += ["-f", str(p)]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            if proc.returncode != 0:
                cache[key] = RenderError(
                    f"helm template {' '.join(p.name for p in paths)} failed: {proc.stderr.strip()}"
                )
            else:
                values: dict = {}
                for p in paths:
                    values = merge_values(values, yaml.safe_load(p.read_text()) or {})
                docs = [d for d in yaml.load_all(proc.stdout, Loader=_LOADER) if d]
                cache[key] = Rendered(tuple(paths), docs, values)
        result = cache[key]
        if isinstance(result, RenderError):
            raise result
        return result

    return _render


# --------------------------------------------------------------------------- Airflow's resolution

_GET_VALUES = r"""
import contextlib, io, json, sys
from airflow.__main__ import main
pairs = json.loads(sys.argv[1])
result = {}
for section, option in pairs:
    sys.argv = ["airflow", "config", "get-value", section, option]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        main()
    result[section + "." + option] = buf.getvalue().rstrip("\n")
print("@@FENCED_RESULT@@" + json.dumps(result))
"""


def cfg_mount(container: dict) -> tuple[str, str]:
    """(mountPath, volume name) of the container's airflow.cfg."""
    for m in container.get("volumeMounts") or []:
        if m.get("subPath") == "airflow.cfg":
            return m["mountPath"], m["name"]
    raise AssertionError(f"container {container['name']} mounts no airflow.cfg")


def local_settings(rendered: Rendered, container: dict, home: Path) -> None:
    """The values' ``airflowLocalSettings`` where ``container`` mounts it, mapped into ``home``
    (Airflow imports ``$AIRFLOW_HOME/config/airflow_local_settings.py`` at start; a
    ``[database] sql_alchemy_connect_args`` may name a dict in it)."""
    pod_home = env_of(container).get("AIRFLOW_HOME", "/opt/airflow")
    for mount in container.get("volumeMounts") or []:
        if mount.get("subPath") == "airflow_local_settings.py":
            assert mount["mountPath"] == f"{pod_home}/config/airflow_local_settings.py", mount
            data = rendered.get("ConfigMap", f"{RELEASE}-config")["data"]["airflow_local_settings.py"]
            (home / "config").mkdir(exist_ok=True)
            (home / "config" / "airflow_local_settings.py").write_text(data)


#: Always resolved, for every render (one Airflow start-up per render covers every test).
STANDARD_PAIRS = [
    ("core", "executor"),
    ("kubernetes_executor", "worker_container_repository"),
    ("kubernetes_executor", "worker_container_tag"),
    ("kubernetes_executor", "pod_template_file"),
]
CONFIG_SECTION = "fenced_kubernetes_executor"


@pytest.fixture(scope="session")
def airflow_config(tmp_path_factory):
    """``airflow_config(rendered)`` -> {"section.option": value or None} for the scheduler.

    Resolves STANDARD_PAIRS plus every [fenced_kubernetes_executor] option the values set (and
    ``mode``), once per render.
    """
    cache: dict[int, dict[str, str | None]] = {}

    def _resolve(rendered: Rendered, component: str = "scheduler", container: str | None = None):
        key = id(rendered)
        if key in cache:
            return cache[key]
        intended = (rendered.values.get("config") or {}).get(CONFIG_SECTION) or {}
        pairs = sorted(set(STANDARD_PAIRS) | {(CONFIG_SECTION, "mode")} | {(CONFIG_SECTION, o) for o in intended})
        c = rendered.container(component, container)
        assert not c.get("envFrom"), f"{component}: envFrom is not modelled by this test: {c['envFrom']}"
        mount_path, volume = cfg_mount(c)
        pod = rendered.workload(component)["spec"]["template"]["spec"]
        cm_name = next(v["configMap"]["name"] for v in pod["volumes"] if v["name"] == volume)
        cfg_text = rendered.get("ConfigMap", cm_name)["data"]["airflow.cfg"]

        container_env = env_of(c)
        pod_home = container_env.get("AIRFLOW_HOME", "/opt/airflow")
        config_path = container_env.get("AIRFLOW_CONFIG", f"{pod_home}/airflow.cfg")
        assert mount_path == config_path, (
            f"{component}: airflow.cfg mounted at {mount_path}, Airflow reads {config_path}"
        )
        home = tmp_path_factory.mktemp(f"airflow-home-{component}")
        (home / "airflow.cfg").write_text(cfg_text)
        local_settings(rendered, c, home)
        env = {k: v for k, v in os.environ.items() if not k.upper().lstrip("_").startswith("AIRFLOW")}
        for name, value in container_env.items():
            env[name] = value.replace("{AIRFLOW_HOME}", str(home))
        env["AIRFLOW_HOME"] = str(home)
        env["AIRFLOW_CONFIG"] = str(home / "airflow.cfg")
        env["HOME"] = str(home)
        proc = subprocess.run(
            [sys.executable, "-c", _GET_VALUES, json.dumps(pairs)],
            env=env, cwd=home, capture_output=True, text=True, timeout=180,
        )
        assert proc.returncode == 0, f"airflow config get-value failed:\n{proc.stdout}\n{proc.stderr}"
        line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("@@FENCED_RESULT@@"))
        raw = json.loads(line.removeprefix("@@FENCED_RESULT@@"))
        result = {k: (v if v != "" else None) for k, v in raw.items()}
        cache[key] = result
        return result

    return _resolve


def project_image(values: dict) -> str:
    airflow = values["images"]["airflow"]
    return f"{airflow['repository']}:{airflow['tag']}"


def kind_image() -> str:
    """The image kind-config/up.sh builds and loads."""
    text = (ROOT / "kind-config" / "up.sh").read_text()
    m = re.search(r'^IMAGE="(\S+?)"', text, re.MULTILINE) or re.search(
        r'^IMAGE="\$\{IMAGE:-(\S+?)\}"', text, re.MULTILINE
    )
    assert m, "kind-config/up.sh must define IMAGE"
    return m.group(1)
