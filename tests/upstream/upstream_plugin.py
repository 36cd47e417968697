"""pytest plugin for running the provider's own executor tests (``-p upstream_plugin``).

Loaded only in the subprocesses that ``test_upstream_provider.py`` starts, next to
``-p no:tests_common.pytest_plugin``: the upstream ``tests/conftest.py`` asks for devel-common's
2,400-line plugin, which needs time-machine, asserts Airflow is not imported yet and sets up a
whole Airflow test environment. Instead this plugin gives the suite the little it uses:

* ``session``, ``dag_maker``, ``create_dummy_dag``, ``create_task_instance`` and
  ``create_task_instance_of_operator`` fixtures, written for Airflow 3.3 (devel-common 0.1.1's
  ``dag_maker`` predates the 3.x serialized-DAG ``create_dagrun``);
* the ``AIRFLOW_V_3_<n>_PLUS`` flags missing from devel-common 0.1.1's ``version_compat``;
* ``conf_vars`` that also sets the Task SDK's ``conf``: on Airflow 3.3 the providers read
  ``airflow.sdk.configuration.conf``, a second parser that devel-common 0.1.1's ``conf_vars``
  (kept, and called first) does not know about;
* a runner for the one ``@pytest.mark.asyncio`` test (no pytest-asyncio here);
* with ``FENCED_UPSTREAM_EXECUTOR=fenced``: ``test_kubernetes_executor.py`` imports
  ``FencedKubernetesExecutor`` under the name ``KubernetesExecutor``, exactly as if its import
  line read ``from fenced_k8s_executor import FencedKubernetesExecutor as KubernetesExecutor``,
  and ``evidence.json`` records how many fenced executors started, in which mode, with a
  sweeper, and how many sweeps ran (so the run proves the fenced code really ran, on defaults);
* in both runs: child processes still alive at the end (say, a watcher process a test started
  and never ended) are counted in ``evidence.json`` and ended, so that the run can exit.

Nothing is copied from devel-common: its modules are imported from the unpacked wheel and only
extended where they fall short on Airflow 3.3.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import inspect
import itertools
import json
import logging
import os
from datetime import timedelta

import pytest

#: The module whose ``KubernetesExecutor`` is swapped, and the provider module it imports it from.
SWAPPED_TEST_MODULE = "test_kubernetes_executor.py"
PROVIDER_MODULE = "airflow.providers.cncf.kubernetes.executors.kubernetes_executor"


def executor_under_test() -> str:
    return os.environ.get("FENCED_UPSTREAM_EXECUTOR", "stock")


def _complete_version_compat() -> None:
    """Add the AIRFLOW_V_3_<minor>_PLUS flags newer provider tests import (0.1.1 has only 3_0)."""
    from tests_common.test_utils import version_compat

    base = version_compat.get_base_airflow_version_tuple()
    for major, last_minor in ((2, 11), (3, 20)):
        for minor in range(last_minor + 1):
            name = f"AIRFLOW_V_{major}_{minor}_PLUS"
            if not hasattr(version_compat, name):
                setattr(version_compat, name, base >= (major, minor, 0))


@contextlib.contextmanager
def _sdk_conf_vars(overrides):
    """Set (and afterwards restore) ``overrides`` on the Task SDK's conf, when it is its own object."""
    from airflow.configuration import conf as core_conf

    try:
        from airflow.sdk.configuration import conf
    except ImportError:
        conf = core_conf
    if conf is core_conf:
        yield
        return
    original = {}
    for (section, key), value in overrides.items():
        original[(section, key)] = conf.get(section, key) if conf.has_option(section, key) else None
        if value is not None:
            if not conf.has_section(section):
                conf.add_section(section)
            conf.set(section, key, value)
        elif conf.has_section(section):
            conf.remove_option(section, key)
    try:
        yield
    finally:
        for (section, key), value in original.items():
            if value is not None:
                conf.set(section, key, value)
            elif conf.has_section(section):
                conf.remove_option(section, key)


def _complete_conf_vars() -> None:
    from tests_common.test_utils import config

    devel_conf_vars = config.conf_vars
    if getattr(devel_conf_vars, "sets_sdk_conf", False):
        return

    @contextlib.contextmanager
    def conf_vars(overrides):
        with devel_conf_vars(overrides), _sdk_conf_vars(overrides):
            yield

    conf_vars.sets_sdk_conf = True
    config.conf_vars = conf_vars


EVIDENCE_FILE = "evidence.json"
_evidence: collections.Counter = collections.Counter()
_warnings: collections.Counter = collections.Counter()


def _count_fenced_starts_and_sweeps() -> None:
    """Count, without changing behaviour, what the fenced executor did during the run."""
    from fenced_k8s_executor import FencedKubernetesExecutor
    from fenced_k8s_executor.sweep import Sweeper

    start = FencedKubernetesExecutor.start
    run_once = Sweeper.run_once

    @functools.wraps(start)
    def counted_start(self, *args, **kwargs):
        result = start(self, *args, **kwargs)
        _evidence["started"] += 1
        _evidence[f"started mode={self.fence.mode.value}"] += 1
        _evidence["started with a sweeper"] += getattr(self, "sweeper", None) is not None
        return result

    @functools.wraps(run_once)
    def counted_run_once(self, *args, **kwargs):
        _evidence["sweeps run"] += 1
        return run_once(self, *args, **kwargs)

    FencedKubernetesExecutor.start = counted_start
    Sweeper.run_once = counted_run_once
    logging.getLogger("fenced_k8s_executor").addHandler(_WarningCounter())


class _WarningCounter(logging.Handler):
    """Warnings of the fenced executor in passing tests too (a fence read failing, say)."""

    def __init__(self):
        super().__init__(level=logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage() == _PROBE:
            _evidence["warning counter live"] = 1
            return
        _evidence["warnings"] += 1
        _warnings[record.getMessage()[:160]] += 1


_PROBE = "upstream_plugin: is the warning counter still attached?"


def _end_leftover_processes() -> None:
    """Child processes still alive when the session ends (a watcher a test started and nobody
    ended) would keep this pytest from exiting (multiprocessing joins them at exit): record them
    in the evidence, then end them so the run finishes.

    First the fenced executors' threads (the watch of pods in flight, the witness's renewals) of
    executors that a test never ended are stopped, those in the middle of a call are waited for
    (up to 10 s together; under load a renewal in flight outlived the stop), and garbage is
    collected: a Manager process
    ends when its executor is collected, and such a thread keeps the executor reachable through
    the test's mocks (its kube client mock holds the exception a test raised through it, whose
    traceback holds the test's frame, which holds the executor); a real client holds nothing of
    the kind."""
    import gc
    import multiprocessing
    import threading
    import time

    from fenced_k8s_executor.in_flight import InFlightPods
    from fenced_k8s_executor.witness import Witness

    watches = [o for o in gc.get_objects() if isinstance(o, InFlightPods | Witness)]
    for watch in watches:
        kind = "pending watches" if isinstance(watch, InFlightPods) else "witnesses"
        _evidence[f"{kind} stopped at exit"] += 1
        watch.stop()
    watches = watch = None  # their last references here
    # a renewal, a sweep or a delete in flight holds its executor in its frames until it returns:
    # let them finish (the stops above end the loops; a test's mock answers at once)
    deadline = time.monotonic() + 10
    for thread in threading.enumerate():
        if thread.name.startswith("fenced-k8s-"):
            _evidence[f"fenced thread waited for at exit {thread.name}"] += 1
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                _evidence[f"fenced thread still running at exit {thread.name}"] += 1
    thread = None
    gc.collect()
    for child in multiprocessing.active_children():
        _evidence["leftover processes"] += 1
        _evidence[f"leftover process {type(child).__module__}.{type(child).__qualname__}"] += 1
        child.terminate()
        child.join(5)
        if child.is_alive():
            child.kill()
            child.join(5)


_seen_children: set[int] = set()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """Name the test after which a child process is still alive (evidence only)."""
    import multiprocessing

    for child in multiprocessing.active_children():
        if child.pid not in _seen_children:
            _seen_children.add(child.pid)
            _evidence[f"leftover after {item.nodeid}"] += 1


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    _end_leftover_processes()
    if executor_under_test() == "fenced":
        logging.getLogger("fenced_k8s_executor").warning(_PROBE)
        with open("fenced-warnings.txt", "w") as out:
            out.writelines(f"{count:5d}  {message}\n" for message, count in _warnings.most_common())
    with open(EVIDENCE_FILE, "w") as out:
        json.dump(dict(_evidence), out, indent=1)


def pytest_configure(config: pytest.Config) -> None:
    _complete_version_compat()
    _complete_conf_vars()
    if executor_under_test() == "fenced":
        _count_fenced_starts_and_sweeps()
    for marker in ("db_test: needs the Airflow database", "backend(name): database backend",
                   "execution_timeout(seconds): upstream per-test timeout (not enforced here)",
                   "asyncio: coroutine test, run with asyncio.run by upstream_plugin"):
        config.addinivalue_line("markers", marker)
    print(f"upstream_plugin: executor under test = {executor_under_test()}")


# ------------------------------------------------------------------ the executor swap


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    """Import the swapped test module while the provider module's ``KubernetesExecutor`` is the
    fenced class, so the module's own ``from ... import KubernetesExecutor`` binds the fenced one
    (decorators such as ``mock.patch.object(KubernetesExecutor, ...)`` included). The provider
    module is restored right after; string patch targets still name the stock class."""
    if not (executor_under_test() == "fenced" and isinstance(collector, pytest.Module)
            and collector.path.name == SWAPPED_TEST_MODULE):
        return (yield)
    import importlib

    from fenced_k8s_executor import FencedKubernetesExecutor

    provider = importlib.import_module(PROVIDER_MODULE)
    stock = provider.KubernetesExecutor
    provider.KubernetesExecutor = FencedKubernetesExecutor
    try:
        report = yield
    finally:
        provider.KubernetesExecutor = stock
    module = getattr(collector, "_obj", None)
    if module is not None and getattr(module, "KubernetesExecutor", None) is not FencedKubernetesExecutor:
        raise RuntimeError(f"{SWAPPED_TEST_MODULE} did not pick up FencedKubernetesExecutor")
    return report


# ------------------------------------------------------------------ asyncio


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function):
    if not inspect.iscoroutinefunction(pyfuncitem.obj):
        return None
    names = pyfuncitem._fixtureinfo.argnames
    asyncio.run(pyfuncitem.obj(**{name: pyfuncitem.funcargs[name] for name in names}))
    return True


# ------------------------------------------------------------------ database fixtures


@pytest.fixture
def session():
    from airflow.utils.session import create_session

    with create_session() as session:
        yield session
        session.rollback()


class DagMaker:
    """``with dag_maker(dag_id) as dag: ...`` then ``dag_maker.create_dagrun()``, for Airflow 3.3.

    On leaving the block the DAG is written to the DB as the dag processor would (DagModel,
    DagVersion, SerializedDagModel, bundle ``testing``); ``create_dagrun`` creates the run from
    the serialized DAG, with its task instances. Runs and task instances are deleted at teardown.
    """

    BUNDLE = "testing"

    def __init__(self, session):
        self.session = session
        self.dag = None
        self.serialized = None
        self.dag_ids: set[str] = set()
        self._runs = itertools.count()

    def __call__(self, dag_id: str = "test_dag", **kwargs):
        from airflow.providers.common.compat.sdk import timezone
        from airflow.sdk import DAG

        kwargs.setdefault("schedule", None)
        kwargs.setdefault("start_date", timezone.datetime(2016, 1, 1))
        self.dag = DAG(dag_id, **kwargs)
        self.dag_ids.add(dag_id)
        return self

    def __enter__(self):
        return self.dag.__enter__()

    def __exit__(self, *exc):
        self.dag.__exit__(*exc)
        if exc[0] is None:
            self._sync()

    def _sync(self) -> None:
        from airflow.dag_processing.collection import update_dag_parsing_results_in_db
        from airflow.models.dagbundle import DagBundleModel
        from airflow.models.serialized_dag import SerializedDagModel
        from airflow.serialization.serialized_objects import LazyDeserializedDAG

        if self.session.get(DagBundleModel, self.BUNDLE) is None:
            self.session.add(DagBundleModel(name=self.BUNDLE))
            self.session.flush()
        update_dag_parsing_results_in_db(
            self.BUNDLE, None, [LazyDeserializedDAG.from_dag(self.dag)], {}, None, set(), session=self.session
        )
        self.session.flush()
        self.serialized = SerializedDagModel.get_dag(self.dag.dag_id, session=self.session)

    def create_dagrun(self, run_id: str | None = None, **kwargs):
        from airflow.utils.state import DagRunState
        from airflow.utils.types import DagRunTriggeredByType, DagRunType

        # Unique per run (DagRun is unique on dag_id + run_id and on dag_id + logical_date).
        number = next(self._runs)
        run_id = run_id or ("test" if number == 0 else f"test_{number}")
        logical_date = kwargs.pop("logical_date", self.dag.start_date + timedelta(days=number))
        kwargs.setdefault("run_type", DagRunType.MANUAL)
        kwargs.setdefault("state", DagRunState.RUNNING)
        kwargs.setdefault("triggered_by", DagRunTriggeredByType.TEST)
        kwargs.setdefault("run_after", logical_date)
        kwargs.setdefault("data_interval", (logical_date, logical_date))
        run = self.serialized.create_dagrun(run_id=run_id, logical_date=logical_date,
                                            session=self.session, **kwargs)
        self.session.flush()
        return run

    def cleanup(self) -> None:
        from sqlalchemy import delete

        from airflow.models.dagrun import DagRun
        from airflow.models.taskinstance import TaskInstance

        self.session.rollback()
        for model in (TaskInstance, DagRun):
            self.session.execute(delete(model).where(model.dag_id.in_(self.dag_ids)))
        self.session.commit()


@pytest.fixture
def dag_maker(session):
    maker = DagMaker(session)
    yield maker
    maker.cleanup()


@pytest.fixture
def create_dummy_dag(dag_maker):
    """A DAG with one EmptyOperator (devel-common's signature, the arguments the suite uses)."""
    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.utils.types import DagRunType

    def create_dag(dag_id="dag", task_id="op1", executor_config=None, with_dagrun_type=DagRunType.SCHEDULED,
                   **kwargs):
        with dag_maker(dag_id, **kwargs) as dag:
            op = EmptyOperator(task_id=task_id, executor_config=executor_config or {})
        if with_dagrun_type is not None:
            dag_maker.create_dagrun(run_type=with_dagrun_type)
        return dag, op

    return create_dag


@pytest.fixture
def create_task_instance(dag_maker, session):
    """One task instance of a one-task DAG (devel-common's signature, the arguments the suite uses)."""
    from airflow.providers.standard.operators.empty import EmptyOperator

    def maker(dag_id="dag", task_id="op1", run_id=None, state=None, executor_config=None,
              operator_class=EmptyOperator, **operator_kwargs):
        with dag_maker(dag_id):
            operator_class(task_id=task_id, executor_config=executor_config or {}, **operator_kwargs)
        run = dag_maker.create_dagrun(run_id=run_id)
        ti = run.get_task_instance(task_id, session=session)
        ti.task = dag_maker.serialized.get_task(task_id)
        if state is not None:
            ti.state = state
        session.flush()
        return ti

    return maker


@pytest.fixture
def create_task_instance_of_operator(create_task_instance):
    def maker(operator_class, *, dag_id, task_id="op1", **operator_kwargs):
        return create_task_instance(dag_id=dag_id, task_id=task_id, operator_class=operator_class,
                                    **operator_kwargs)

    return maker
