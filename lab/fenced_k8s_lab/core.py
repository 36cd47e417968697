"""An airflow-core driver: every metadata change made through Airflow's own code.

Tests, the lab and the benchmark use it to build interleavings deliberately without writing rows
by hand. What each step calls:

- DAGs: a real DAG file, parsed by ``DagBag`` and written by ``sync_bag_to_db`` (the
  dag-processor's serialization and sync).
- Runs: the serialized DAG's ``create_dagrun``; TIs are scheduled by the scheduler's own
  ``_schedule_dag_run`` (``DagRun.update_state`` + ``schedule_tis``).
- Queueing: a real ``Job`` row and ``SchedulerJobRunner`` whose ``_critical_section_enqueue_task_instances``
  (``_executable_task_instances_to_queued`` + ``_enqueue_task_instances_with_queued_state``)
  queues the TIs with the executor(s) under test: this is what pre-assigns the launch token.
- Executor events: ``SchedulerJobRunner.process_executor_events``; stuck in queued:
  ``_handle_tasks_stuck_in_queued``; a dead peer: ``adopt_or_reset_orphaned_tasks``.
- Clearing: ``clear_task_instances`` (``prepare_db_for_next_try``).
- The worker's side: the execution API routes (``PATCH /run``, ``PATCH /state``) through
  ``InProcessExecutionAPI`` (the app ``dag.test()`` uses; auth is bypassed, routes are real),
  with the HTTP client of its transport (httpx, or httpx2 on Airflow 3.4). On 3.4 those routes
  read through ``settings.AsyncSession``, which Airflow's ORM set-up builds when an async driver
  for the metadata DB is installed (the lab's asyncpg).

The process's Airflow ORM must already point at the metadata DB (``settings.reconfigure_orm``).
Reading rows (``Airflow.row``) is plain SQL: assertions may read, never write.
"""

from __future__ import annotations

import inspect
import textwrap
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Iterable

BUNDLE = "dags-folder"

DAG_FILE = '''
import pendulum
from airflow.sdk import DAG, task
{imports}

with DAG(dag_id={dag_id!r}, schedule=None, start_date=pendulum.datetime(2024, 1, 1), catchup=False,
         max_active_tasks=64, default_args={{"retries": {retries}, "retry_delay": pendulum.duration(seconds=0)}}):
    for task_id in {task_ids!r}:
        @task(task_id=task_id, {task_kwargs})
        def work():
            return None

        work()
'''


@dataclass(frozen=True)
class Row:
    """A task instance row as read back from the DB (for assertions and for the next step)."""

    id: str
    dag_id: str
    task_id: str
    run_id: str
    map_index: int
    try_number: int
    state: str | None
    external_executor_id: str | None
    queued_by_job_id: int | None

    @property
    def token(self) -> str | None:
        return self.external_executor_id

    @property
    def key(self):
        """The key the provider's executor uses for this TI (``running``, the event buffer):
        a ``TaskInstanceUuid`` where it keys by UUID (Airflow 3.4), else the ``TaskInstanceKey``."""
        from airflow.models.taskinstancekey import TaskInstanceKey

        coordinates = TaskInstanceKey(self.dag_id, self.task_id, self.run_id, self.try_number, self.map_index)
        from airflow.providers.cncf.kubernetes.executors.kubernetes_executor import KubernetesExecutor

        if getattr(KubernetesExecutor, "supports_task_instance_uuid", False):
            return KubernetesExecutor.get_task_key(_KeyOf(uuid.UUID(self.id), coordinates))
        return coordinates


@dataclass(frozen=True)
class _KeyOf:
    """What ``get_task_key`` reads of a TI."""

    id: uuid.UUID
    key: Any


class Airflow:
    """One Airflow deployment as the test sees it: DAG files, runs, the execution API, clears."""

    def __init__(self, dags_folder: Path):
        self.dags_folder = Path(dags_folder)
        self.dags_folder.mkdir(parents=True, exist_ok=True)
        self._api = None
        self._execution_api = None

    # ------------------------------------------------------------------ DAGs and runs

    def add_dag(self, dag_id: str, task_ids: Iterable[str], *, retries: int = 2, imports: str = "",
                task_kwargs: str = "") -> None:
        """Write a DAG file and parse/serialize it the way the dag-processor does.

        ``imports`` (source lines) and ``task_kwargs`` (source of extra ``@task`` keyword
        arguments, e.g. an ``executor_config``) customise every task of the file."""
        from airflow.dag_processing.bundles.manager import DagBundlesManager
        from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db

        path = self.dags_folder / f"{dag_id}.py"
        path.write_text(textwrap.dedent(DAG_FILE.format(dag_id=dag_id, task_ids=list(task_ids), retries=retries,
                                                           imports=imports, task_kwargs=task_kwargs)))
        _sync_bundles(DagBundlesManager())
        bag = DagBag(dag_folder=path, bundle_path=self.dags_folder, bundle_name=BUNDLE)
        if bag.import_errors or dag_id not in bag.dags:
            raise RuntimeError(f"DAG file {path} did not parse: {bag.import_errors}")
        sync_bag_to_db(bag, BUNDLE, None)
        from airflow.models.dag import DagModel
        from airflow.utils.session import create_session

        with create_session() as session:  # what `airflow dags unpause` does
            session.get(DagModel, dag_id).is_paused = False

    def pause(self, dag_id: str) -> None:
        from airflow.models.dag import DagModel
        from airflow.utils.session import create_session

        with create_session() as session:
            model = session.get(DagModel, dag_id)
            if model is not None:
                model.is_paused = True

    def retire(self, dag_id: str) -> None:
        """Pause the DAG and mark its unfinished runs failed (what a user does in the UI: running
        TIs fail, pending ones are skipped), so no scheduler schedules, queues or adopts anything
        of it any more and its TIs stop holding pool slots."""
        from sqlalchemy import func, select

        from airflow.api.common.mark_tasks import set_dag_run_state_to_failed
        from airflow.models.dagrun import DagRun
        from airflow.models.taskinstance import TaskInstance
        from airflow.ti_deps.dependencies_states import EXECUTION_STATES
        from airflow.utils.session import create_session
        from airflow.utils.state import DagRunState

        self.pause(dag_id)
        dag = self.serialized_dag(dag_id)
        with create_session() as session:
            run_ids = list(session.scalars(select(DagRun.run_id).where(DagRun.dag_id == dag_id,
                                                                       DagRun.state != DagRunState.FAILED)))
        for run_id in run_ids:
            with create_session() as session:
                set_dag_run_state_to_failed(dag=dag, run_id=run_id, commit=True, session=session)
        with create_session() as session:
            holding = session.scalar(select(func.count()).select_from(TaskInstance).where(
                TaskInstance.dag_id == dag_id, TaskInstance.state.in_(list(EXECUTION_STATES))))
        if holding:
            raise RuntimeError(f"{holding} TIs of {dag_id} still hold pool slots after retiring it")

    def serialized_dag(self, dag_id: str):
        from airflow.models.serialized_dag import SerializedDagModel
        from airflow.utils.session import create_session

        with create_session() as session:
            return SerializedDagModel.get_dag(dag_id, session=session)

    def create_run(self, dag_id: str, run_id: str | None = None) -> str:
        """A manual run made by the serialized DAG's own create_dagrun; returns its run_id."""
        from airflow.utils import timezone
        from airflow.utils.session import create_session
        from airflow.utils.state import DagRunState
        from airflow.utils.types import DagRunTriggeredByType, DagRunType

        dag = self.serialized_dag(dag_id)
        run_id = run_id or f"manual__{uuid.uuid4().hex[:8]}"
        now = timezone.utcnow()
        with create_session() as session:
            dag.create_dagrun(
                run_id=run_id,
                logical_date=now,
                data_interval=(now, now),
                run_after=now,
                run_type=DagRunType.MANUAL,
                triggered_by=DagRunTriggeredByType.TEST,
                state=DagRunState.RUNNING,
                start_date=now,
                session=session,
            )
        return run_id

    # ------------------------------------------------------------------ reads (assertions)

    def row(self, dag_id: str, task_id: str, run_id: str, map_index: int = -1) -> Row | None:
        from sqlalchemy import select

        from airflow.models.taskinstance import TaskInstance as TI
        from airflow.utils.session import create_session

        with create_session() as session:
            ti = session.scalar(
                select(TI).where(TI.dag_id == dag_id, TI.task_id == task_id, TI.run_id == run_id,
                                 TI.map_index == map_index)
            )
            return _row(ti) if ti is not None else None

    def row_by_id(self, ti_id: str) -> Row | None:
        from airflow.models.taskinstance import TaskInstance as TI
        from airflow.utils.session import create_session

        with create_session() as session:
            ti = session.get(TI, uuid.UUID(str(ti_id)))
            return _row(ti) if ti is not None else None

    # ------------------------------------------------------------------ user actions

    def clear(self, row: Row, **kwargs: Any) -> Row:
        """Clear one task instance as the UI/API does (``clear_task_instances``): new id; a running
        TI becomes RESTARTING and keeps its external_executor_id, any other loses it."""
        from sqlalchemy import select

        from airflow.models.taskinstance import TaskInstance as TI, clear_task_instances
        from airflow.utils.session import create_session

        with create_session() as session:
            tis = list(session.scalars(select(TI).where(TI.id == uuid.UUID(row.id))))
            clear_task_instances(tis, session, **kwargs)
        return self.row(row.dag_id, row.task_id, row.run_id, row.map_index)

    def next_try(self, row: Row) -> Row:
        """``prepare_db_for_next_try``, as a retry, a clear or an orphan reset calls it: a new id for
        the task's next try (before Airflow 3.4 the row moves to it; 3.4 archives the attempt's
        row and inserts its successor). Returns the task's live row."""
        from airflow.models.taskinstance import TaskInstance as TI
        from airflow.utils.session import create_session

        with create_session() as session:
            ti = session.get(TI, uuid.UUID(row.id))
            ti.prepare_db_for_next_try(session)
        return self.row(row.dag_id, row.task_id, row.run_id, row.map_index)

    # ------------------------------------------------------------------ the worker (execution API)

    @property
    def api(self):
        if self._api is None:
            import importlib

            from airflow.api_fastapi.execution_api.app import InProcessExecutionAPI

            # Kept: on Airflow 3.2 the lifespan (its services registry) ends when this object goes.
            self._execution_api = api = InProcessExecutionAPI()
            transport = api.transport
            _wait_for_lifespan(api.app)
            # The client of the transport's own library: httpx up to 3.3, httpx2 on 3.4.
            http = importlib.import_module(type(transport).__module__.split(".")[0])
            self._api = http.Client(transport=transport, base_url="http://in-process.invalid/")
        return self._api

    def start(self, row: Row, *, hostname: str = "worker-pod", pid: int = 4242) -> Any:
        """The worker's first call: ``PATCH /task-instances/{id}/run`` (QUEUED -> RUNNING)."""
        from airflow.utils import timezone

        body = {"state": "running", "hostname": hostname, "unixname": "airflow", "pid": pid,
                "start_date": timezone.utcnow().isoformat()}
        resp = self.api.patch(f"task-instances/{row.id}/run", json=body)
        if resp.status_code != 200:
            raise RuntimeError(f"/run answered {resp.status_code}: {resp.text}")
        return resp

    def finish(self, row: Row, state: str) -> Any:
        """The worker reports the outcome: ``PATCH /task-instances/{id}/state`` (success,
        failed, up_for_retry ...). up_for_retry gives the row a new id (prepare_db_for_next_try)."""
        from airflow.utils import timezone

        body: dict[str, Any] = {"state": state, "end_date": timezone.utcnow().isoformat()}
        if state == "success":
            body.update(task_outlets=[], outlet_events=[])
        resp = self.api.patch(f"task-instances/{row.id}/state", json=body)
        if resp.status_code not in (200, 204):
            raise RuntimeError(f"/state answered {resp.status_code}: {resp.text}")
        return resp

    def close(self) -> None:
        if self._api is not None:
            self._api.close()
            self._api = None
            self._execution_api = None


def _row(ti: Any) -> Row:
    state = ti.state
    return Row(
        id=str(ti.id), dag_id=ti.dag_id, task_id=ti.task_id, run_id=ti.run_id, map_index=ti.map_index,
        try_number=ti.try_number, state=None if state is None else str(getattr(state, "value", state)),
        external_executor_id=ti.external_executor_id, queued_by_job_id=ti.queued_by_job_id,
    )


class Scheduler:
    """One scheduler: a real Job row and a SchedulerJobRunner around the executor(s) under test.

    The executors are the ones the scheduler would load (``ExecutorLoader``); the caller builds
    and starts them with ``job_id`` (``Scheduler.new_job()`` first), as ``SchedulerJob`` does.
    """

    def __init__(self, job: Any, executors: list):
        from airflow.jobs.scheduler_job_runner import SchedulerJobRunner

        for executor in executors:
            _name(executor)
        self.job = job
        self.executors = executors
        self.runner = SchedulerJobRunner(job=job, executors=executors)

    @staticmethod
    def new_job(hostname: str | None = None) -> Any:
        """A running SchedulerJob row (what ``airflow scheduler`` writes at start); returns the Job.
        ``hostname``: the host it runs on (default: this machine's, as airflow-core records it)."""
        from airflow.jobs.job import Job

        job = Job(job_type="SchedulerJob")
        if hostname is not None:
            job.hostname = hostname
        job.prepare_for_execution()
        return job

    @property
    def job_id(self) -> int:
        return self.job.id

    @property
    def executor(self):
        return self.executors[0]

    # ------------------------------------------------------------------ the loop's steps

    def schedule(self, dag_id: str, run_id: str) -> None:
        """The scheduler's ``_schedule_dag_run``: decide what can run and move it to SCHEDULED."""
        from sqlalchemy import select

        from airflow.models.dagrun import DagRun
        from airflow.utils.session import create_session

        with create_session() as session:
            dag_run = session.scalar(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
            self.runner._schedule_dag_run(dag_run, session)

    def enqueue(self) -> int:
        """The critical section: SCHEDULED -> QUEUED (token pre-assigned) and queue_workload."""
        from airflow.utils.session import create_session

        with create_session() as session:
            return self.runner._critical_section_enqueue_task_instances(session=session)

    def trigger(self, open_slots: int = 64) -> None:
        """The first half of the executor heartbeat: queued workloads -> execute_async (task queue)."""
        for executor in self.executors:
            trigger(executor, open_slots)

    def queue(self, dag_id: str, run_id: str, *, trigger: bool = True) -> int:
        """schedule + enqueue (+ trigger): what one scheduler loop does for a fresh run."""
        self.schedule(dag_id, run_id)
        queued = self.enqueue()
        if trigger:
            self.trigger()
        return queued

    def process_events(self) -> int:
        from airflow.utils.session import create_session

        total = 0
        for executor in self.executors:
            with create_session() as session:
                total += self.runner._process_executor_events(executor, session)
        return total

    def stuck_in_queued(self, *, timeout: float = 0.0) -> None:
        """``_handle_tasks_stuck_in_queued`` with ``[scheduler] task_queued_timeout`` = ``timeout``:
        revoke, then back to SCHEDULED with the same id and try."""
        from airflow.utils.session import create_session

        self.runner._task_queued_timeout = timeout
        with create_session() as session:
            self.runner._handle_tasks_stuck_in_queued(session=session)

    def requeue_stuck(self, dag_id: str, run_id: str, *, trigger: bool = True) -> int:
        """Stuck in queued, then queued again by the next loop: same id and try, a new token."""
        self.stuck_in_queued()
        queued = self.enqueue()
        if trigger:
            self.trigger()
        return queued

    def heartbeat(self) -> None:
        """The Job heartbeat (keeps this scheduler alive for its peers' orphan checks)."""
        from airflow.utils.session import create_session

        with create_session() as session:
            self.job.heartbeat(heartbeat_callback=self.runner.heartbeat_callback, session=session)

    def adopt_or_reset_orphans(self) -> int:
        """``adopt_or_reset_orphaned_tasks``: schedulers whose heartbeat is older than
        ``[scheduler] scheduler_health_check_threshold`` are failed; their TIs are adopted or reset."""
        from airflow.utils.session import create_session

        self.heartbeat()
        with create_session() as session:
            return self.runner.adopt_or_reset_orphaned_tasks(session=session)

    def stop(self) -> None:
        """A clean scheduler exit, as ``airflow scheduler`` makes it on SIGTERM: the executors are
        ended (``SchedulerJobRunner._execute``'s ``finally``), ``execute_job`` marks the Job
        ``success`` and ``run_job`` completes it, so peers see a stopped scheduler, not a live one
        whose heartbeat has yet to age out."""
        from airflow.jobs.job import execute_job

        if self.job.state != "running":
            return  # stopped already (or never started)
        try:
            execute_job(self.job, execute_callable=self._end_executors)
        finally:
            self.job.complete_execution()

    def _end_executors(self) -> None:
        for executor in self.executors:
            try:
                if getattr(executor, "task_queue", None) is not None or getattr(executor, "kube_scheduler", None):
                    executor.end()
            except Exception:  # as _execute does: one executor's failure does not skip the others
                pass


def trigger(executor: Any, open_slots: int) -> None:
    """The executor heartbeat's first half: ``trigger_workloads`` (Airflow 3.4), else ``trigger_tasks``
    (3.4 keeps it as a deprecated alias that warns)."""
    method = getattr(executor, "trigger_workloads", None) or executor.trigger_tasks
    method(open_slots=open_slots)


def _name(executor: Any) -> None:
    """Give an executor built outside ExecutorLoader the name the scheduler routes by."""
    if getattr(executor, "name", None) is not None:
        return
    from airflow.executors.executor_utils import ExecutorName

    cls = type(executor)
    executor.name = ExecutorName(module_path=f"{cls.__module__}.{cls.__qualname__}", alias=None)


def health_check_window() -> timedelta:
    from airflow.configuration import conf

    return timedelta(seconds=conf.getint("scheduler", "scheduler_health_check_threshold"))


def our_deployment() -> str | None:
    """The deployment stamp this process's fenced executors put on their pods (None for package
    versions without deployment stamps)."""
    try:
        from fenced_k8s_executor import config, deployment
    except ImportError:
        return None
    from airflow.configuration import conf

    return deployment.resolve(config.load(conf)).id


def _sync_bundles(manager: Any) -> None:
    """Write the configured DAG bundles as the dag-processor does, leaving other processes'
    bundles alone where airflow-core can (``deactivate_missing``, Airflow 3.3; 3.2 always
    deactivates the bundles its configuration lacks, none in the lab)."""
    if "deactivate_missing" in inspect.signature(manager.sync_bundles_to_db).parameters:
        manager.sync_bundles_to_db(deactivate_missing=False)
    else:
        manager.sync_bundles_to_db()


def _wait_for_lifespan(app: Any, timeout: float = 30.0) -> None:
    """Wait until the in-process execution API's lifespan has started (its services registry is
    set): Airflow 3.3's ``InProcessExecutionAPI.transport`` waits for it, 3.2's starts it in the
    background, so a first request could meet an app without services (500)."""
    import time

    deadline = time.monotonic() + timeout
    while getattr(app.state, "svcs_registry", None) is None:
        if time.monotonic() > deadline:
            raise RuntimeError("the in-process execution API did not start within 30 s")
        time.sleep(0.01)
