"""Configuration fails closed (issue 47): a typo in the rollout setting stops every component at
start, naming what it read and what was meant.

Before, each typo below left the executor in ``enforce``, the default, silently: ``config.load``
read only the option names it knew, so an option it did not know, an environment variable of a
section named close to ours and a file section named so were never seen, and the rollout's
observe-only phase deleted pods. Each runs here through the real ``airflow`` entry point of each
component, configured by its environment and ``airflow.cfg`` only (Airflow's own config object
reads them): the scheduler (the executor's ``start()``; the ``fenced_run_gate`` plugin, which every
Airflow process loads, may refuse first), the api-server (the plugin), and ``airflow fenced-k8s
pods``. A scheduler that starts is killed after the wait and fails its test.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from airflow_process import Done, airflow_env, run_airflow
from fenced_k8s_executor import config

pytestmark = pytest.mark.integration

#: typo -> (environment variables, airflow.cfg text, what the refusal must name)
TYPOS = {
    "option_modes": ({"AIRFLOW__FENCED_KUBERNETES_EXECUTOR__MODES": "audit"}, "",
                     ["'modes'", "did you mean 'mode'"]),
    "section_fenced_kubernetes": ({"AIRFLOW__FENCED_KUBERNETES__MODE": "audit"}, "",
                                  ["AIRFLOW__FENCED_KUBERNETES__MODE", "AIRFLOW__FENCED_KUBERNETES_EXECUTOR__MODE"]),
    "section_fenced_k8s_executor": ({"AIRFLOW__FENCED_K8S_EXECUTOR__MODE": "audit"}, "",
                                    ["AIRFLOW__FENCED_K8S_EXECUTOR__MODE", "AIRFLOW__FENCED_KUBERNETES_EXECUTOR__MODE"]),
    "option_sweep_intreval": ({"AIRFLOW__FENCED_KUBERNETES_EXECUTOR__SWEEP_INTREVAL": "10"}, "",
                              ["'sweep_intreval'", "did you mean 'sweep_interval'"]),
    "file_section_fenced_kubernetes": ({}, "[fenced_kubernetes]\nmode = audit\n",
                                       ["[fenced_kubernetes]", "[fenced_kubernetes_executor]"]),
    "file_option_modes": ({}, "[fenced_kubernetes_executor]\nmodes = audit\n", ["'modes'", "did you mean 'mode'"]),
}
COMPONENTS = ("scheduler", "api-server", "cli")


def _command(component: str) -> list[str]:
    if component == "scheduler":
        return ["scheduler"]
    if component == "api-server":
        from fenced_k8s_lab.postgres import free_port

        return ["api-server", "-H", "127.0.0.1", "-p", str(free_port())]
    return ["fenced-k8s", "pods"]


@pytest.fixture(scope="module")
def refusals(metadata_db, tmp_path_factory) -> dict[tuple[str, str], Done]:
    """Every typo on every component, three processes at a time (start-up dominates)."""
    url = metadata_db.url.render_as_string(hide_password=False)

    def one(typo: str, component: str) -> Done:
        variables, cfg, _ = TYPOS[typo]
        home = tmp_path_factory.mktemp(f"{typo}-{component}")
        if cfg:
            (home / "airflow.cfg").write_text(cfg)
        return run_airflow(_command(component), airflow_env(url, home, **variables), wait=150)

    cases = [(typo, component) for typo in TYPOS for component in COMPONENTS]
    with ThreadPoolExecutor(3) as pool:
        return dict(zip(cases, pool.map(lambda case: one(*case), cases)))


@pytest.mark.parametrize("component", COMPONENTS)
@pytest.mark.parametrize("typo", list(TYPOS))
def test_a_typo_stops_the_component_naming_it(refusals, typo, component):
    done = refusals[typo, component]
    assert done.returncode is not None, f"airflow {component} kept running with {typo}:\n{done.output[-3000:]}"
    assert done.returncode != 0, done.output[-3000:]
    for name in TYPOS[typo][2]:
        assert name in done.output, f"{name!r} not named:\n{done.output[-3000:]}"
    if component == "cli":  # the operator's command: one line on stderr, exit 1, no traceback
        assert done.returncode == 1 and "Traceback" not in done.output, done.output[-3000:]
        assert done.stderr.strip().splitlines()[-1].startswith("airflow fenced-k8s pods: Invalid fenced-k8s-executor")


@pytest.fixture
def world(metadata_db, airflow, emulator_session, tmp_path, monkeypatch, request, world_opener):
    """The integration world on the emulator only: the check runs before any Kubernetes call."""
    open_world, tasks_of = world_opener
    emulator_session.reset()
    task_ids, dag_kwargs = tasks_of(request)
    with open_world(emulator_session, metadata_db, airflow, tmp_path, monkeypatch, task_ids, dag_kwargs) as w:
        yield w


@pytest.mark.parametrize("typo", [t for t in TYPOS if not t.startswith("file_section")])
def test_a_typo_stops_the_executors_start(world, typo, monkeypatch):
    """The executor's own check in this process, where no plugin is loaded: ``start()`` as the
    scheduler calls it, reading Airflow's global config object (a file's option set into it)."""
    from airflow.configuration import conf

    variables, cfg, names = TYPOS[typo]
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    option = None
    if cfg:
        section, line = cfg.splitlines()
        option = (section.strip("[]"), *(part.strip() for part in line.split("=")))
        conf.set(*option)
    try:
        with pytest.raises(config.FencedConfigError) as refused:
            world.scheduler("fenced")
    finally:
        if option is not None:
            conf.remove_option(*option[:2])
    for name in names:
        assert name in str(refused.value)
