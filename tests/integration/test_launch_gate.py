"""Launch gate end to end: real PostgreSQL with Airflow's schema, a real `airflow api-server`
(plugin loaded from the package's entry point) and real worker processes. No mocks.

Every task instance is made and moved by airflow-core's own code (``lab.core`` through the
integration ``open_world``): parsed DAGs, the scheduler's critical section (which pre-assigns the
launch token), stuck-in-queued re-queues (same id and try, new token), ``clear_task_instances``,
the execution API. The module only reads rows. One api-server serves every test in the module
(start-up dominates the runtime); the Kubernetes side is the emulator (the gate never calls it;
the scheduler's revoke does).
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pytest

from fenced_k8s_executor import launch_claim, metrics, worker

pytestmark = pytest.mark.integration

SECRET = "launch-gate-integration-secret-" + "z" * 64
AUDIENCE = "urn:airflow.apache.org:task"
RUN_PAYLOAD = {"state": "running", "hostname": "gate-host", "unixname": "gate", "pid": 4242}


@dataclass
class Stack:
    base: str
    env: dict
    port: int
    url: str
    log: Path

    def sql(self, query: str, params: tuple = ()) -> list:
        """Reads only: every write goes through airflow-core."""
        import sqlalchemy as sa

        assert query.lstrip().upper().startswith("SELECT"), query
        engine = sa.create_engine(self.url, poolclass=sa.pool.NullPool)
        try:
            with engine.connect() as conn:
                return [tuple(r) for r in conn.exec_driver_sql(query, params).fetchall()]
        finally:
            engine.dispose()


def _generator():
    from airflow.api_fastapi.auth.tokens import JWTGenerator

    return JWTGenerator(secret_key=SECRET, audience=AUDIENCE, valid_for=600, issuer=None, algorithm="HS512", kid="not-used")


def _airflow_env(url: str, home: Path, port: int, *, run_gate: bool = True) -> dict:
    from cryptography.fernet import Fernet

    from fenced_k8s_lab.postgres import airflow_db_env

    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    (home / "dags").mkdir(parents=True, exist_ok=True)
    env.update(airflow_db_env(url))
    env.update(
        AIRFLOW_HOME=str(home),
        AIRFLOW__CORE__DAGS_FOLDER=str(home / "dags"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__CORE__FERNET_KEY=Fernet.generate_key().decode(),
        AIRFLOW__API__SECRET_KEY="gate-api-secret",
        AIRFLOW__API_AUTH__JWT_SECRET=SECRET,
        AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS="True",
        AIRFLOW__CORE__EXECUTION_API_SERVER_URL=f"http://127.0.0.1:{port}/execution/",
        AIRFLOW__FENCED_KUBERNETES_EXECUTOR__RUN_GATE=str(run_gate),
        AIRFLOW__LOGGING__BASE_LOG_FOLDER=str(home / "logs"),
        PYTHONUNBUFFERED="1",
    )
    return env


@pytest.fixture(scope="module")
def stack(metadata_db, tmp_path_factory):
    """An api-server with the run gate on the session's metadata DB."""
    import httpx

    from fenced_k8s_lab import postgres as labpg

    url = metadata_db.url.render_as_string(hide_password=False)
    proc = None
    try:
        home = tmp_path_factory.mktemp("airflow_home")
        port = labpg.free_port()
        st = Stack(base=f"http://127.0.0.1:{port}", env=_airflow_env(url, home, port), port=port, url=url,
                   log=home / "api-server.log")
        with open(st.log, "wb") as logf:
            proc = subprocess.Popen(
                [sys.executable, "-m", "airflow", "api-server", "-H", "127.0.0.1", "-p", str(port)],
                env=st.env, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True,
            )
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{st.base}/execution/health", timeout=10).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"api-server did not start:\n{st.log.read_text()[-4000:]}")
            time.sleep(0.5)
        # warm the execution API up (the first authenticated call is slow)
        warm = str(uuid.uuid4())
        _run(st, warm, launch_claim.mint(_generator(), ti_id=warm, token=str(uuid.uuid4()), valid_for=60))
        yield st
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


@pytest.fixture
def world(metadata_db, airflow, emulator_session, tmp_path, monkeypatch, request, world_opener):
    """The integration world on the emulator only: the gate is an api-server matter."""
    open_world, tasks_of = world_opener
    emulator_session.reset()
    task_ids, dag_kwargs = tasks_of(request)
    with open_world(emulator_session, metadata_db, airflow, tmp_path, monkeypatch, task_ids,
                    {"retries": 0, **dag_kwargs}) as w:
        yield w
    emulator_session.clear_faults()


def _queued(world) -> tuple:
    """Queue the run's tasks through a fenced scheduler (tokens pre-assigned); nothing is
    triggered, so no pod exists. Returns (scheduler, rows by task id)."""
    sched = world.scheduler("fenced")
    assert world.queue(sched, trigger=False) >= 1
    return sched, {t: world.row(t) for t in _task_ids(world)}


def _requeued(world, sched) -> dict:
    """Stuck in queued: revoke, back to SCHEDULED, queued again: same id and try, new token."""
    world.requeue_stuck(sched, trigger=False)
    return {t: world.row(t) for t in _task_ids(world)}


def _task_ids(world) -> list[str]:
    return list(world.airflow.serialized_dag(world.dag_id).task_dict)


def _row(stack: Stack, ti_id: str) -> tuple:
    rows = stack.sql("SELECT state, hostname, external_executor_id FROM task_instance WHERE id = %s", (ti_id,))
    return rows[0] if rows else None


def _run(stack: Stack, ti_id: str, jwt_token: str | None):
    import httpx

    headers = {"Authorization": f"Bearer {jwt_token}"} if jwt_token else {}
    body = {**RUN_PAYLOAD, "start_date": datetime.now(tz=timezone.utc).isoformat()}
    return httpx.patch(f"{stack.base}/execution/task-instances/{ti_id}/run", json=body, headers=headers, timeout=60)


def _claim(ti_id: str, token: str) -> str:
    return launch_claim.mint(_generator(), ti_id=ti_id, token=token, valid_for=600)


def _gone() -> tuple[int, str]:
    """Core's answer to /run of a cleared launch's TI id, and the fenced worker's reason for it:
    404 (the id is gone) before Airflow 3.4; 410 on 3.4, which keeps the archived attempt's row."""
    from fenced_k8s_executor import provider_compat

    return (410, "attempt_archived") if provider_compat.task_columns().live is not None else (404, "ti_not_found")


def _stock(ti_id: str) -> str:
    from airflow.executors.workloads.base import BaseWorkloadSchema

    return BaseWorkloadSchema.generate_token(ti_id, _generator())


# --- (a) the current launch: stock behaviour ------------------------------------------------


def test_run_with_current_claim_starts_the_task(stack, world):
    _, rows = _queued(world)
    row = rows["t1"]
    resp = _run(stack, row.id, _claim(row.id, row.token))
    assert resp.status_code == 200, resp.text
    assert resp.json()["max_tries"] == 0
    assert resp.headers.get("Refreshed-API-Token")  # the route's workload -> execution swap ran
    assert _row(stack, row.id)[:2] == ("running", "gate-host")


# --- (b) a superseded launch of the same id and try: 409, not started -------------------------


def test_run_with_stale_claim_is_rejected_and_not_started(stack, world):
    sched, before = _queued(world)
    old = before["t1"]
    new = _requeued(world, sched)["t1"]
    assert (new.id, new.try_number, new.state) == (old.id, old.try_number, "queued") and new.token != old.token

    resp = _run(stack, old.id, _claim(old.id, old.token))
    assert resp.status_code == 409, resp.text
    assert resp.json() == {
        "detail": {
            "reason": "stale_executor_launch",
            "message": resp.json()["detail"]["message"],
            "ti_id": old.id,
            "launch": metrics.short(old.token),
            "current_launch": metrics.short(new.token),
        }
    }
    assert old.token not in resp.text and new.token not in resp.text
    assert _row(stack, old.id) == ("queued", "", new.token)  # never started (the queued row's hostname)

    # the current launch still starts
    resp = _run(stack, new.id, _claim(new.id, new.token))
    assert resp.status_code == 200, resp.text
    assert _row(stack, new.id)[0] == "running"


def test_stale_claim_on_a_running_ti_is_rejected(stack, world):
    """The stale pod comes late, after the current launch started: still refused."""
    sched, before = _queued(world)
    old = before["t1"]
    new = _requeued(world, sched)["t1"]
    assert _run(stack, new.id, _claim(new.id, new.token)).status_code == 200
    resp = _run(stack, old.id, _claim(old.id, old.token))  # same hostname/pid: stock would say "duplicate, 200"
    assert resp.status_code == 409 and resp.json()["detail"]["reason"] == "stale_executor_launch"


# --- (c) cleared ids: core's own 404 (410 on Airflow 3.4) --------------------------------------


@pytest.mark.tasks("t1")
def test_run_for_a_cleared_ti_id_gets_cores_own_answer(stack, world):
    """A clear gives the task a new id: the old launch's id is gone (404), or on Airflow 3.4 its
    archived attempt (410). The gate leaves both to the route."""
    _, rows = _queued(world)
    old = rows["t1"]
    cleared = world.airflow.clear(old)
    assert cleared.id != old.id
    resp = _run(stack, old.id, _claim(old.id, old.token))
    assert resp.status_code == _gone()[0]
    assert resp.json()["detail"]["reason"] == "not_found"


# --- (d) untouched: no claim, legacy rows, invalid tokens -------------------------------------


def test_run_without_claim_is_untouched(stack, world):
    _, rows = _queued(world)
    row = rows["t1"]
    resp = _run(stack, row.id, _stock(row.id))
    assert resp.status_code == 200, resp.text
    assert _row(stack, row.id)[0] == "running"


def test_legacy_row_is_not_fenced(stack, world):
    """Queued by the stock executor: the scheduler writes the executor's QUEUED info (its job id)
    into external_executor_id. A claim cannot be compared with that: the gate lets it through."""
    sched = world.scheduler("stock")
    world.queue(sched)  # the stock execute_async reports (QUEUED, job id)
    sched.process_events()
    row = world.row("t1")
    assert row.token == str(sched.job_id)
    resp = _run(stack, row.id, _claim(row.id, str(uuid.uuid4())))
    assert resp.status_code == 200, resp.text


@pytest.mark.tasks("t1", "t2")
def test_invalid_jwt_with_claim_gets_the_routes_own_answer(stack, world):
    from airflow.api_fastapi.auth.tokens import JWTGenerator

    _, rows = _queued(world)
    row, other = rows["t1"], rows["t2"]
    stale = str(uuid.uuid4())
    forged_gen = JWTGenerator(secret_key="not-the-secret-" + "q" * 64, audience=AUDIENCE, valid_for=60,
                              issuer=None, algorithm="HS512", kid="not-used")
    forged = launch_claim.mint(forged_gen, ti_id=row.id, token=stale, valid_for=60)
    resp = _run(stack, row.id, forged)
    assert resp.status_code == 403 and resp.json()["detail"] == "Invalid auth token"
    assert _run(stack, row.id, None).status_code in (401, 403)  # the route's own answer, unchanged
    # a claim for another TI id: the route's ti:self check answers, not the gate
    resp = _run(stack, row.id, _claim(other.id, stale))
    assert resp.status_code == 403 and "does not match" in resp.text
    assert _row(stack, row.id)[0] == "queued"


def test_other_methods_and_paths_are_untouched(stack, world):
    import httpx

    _, rows = _queued(world)
    row = rows["t1"]
    headers = {"Authorization": f"Bearer {_claim(row.id, str(uuid.uuid4()))}"}
    # GET on /run: the route table answers 405, the gate does not look at it
    resp = httpx.get(f"{stack.base}/execution/task-instances/{row.id}/run", headers=headers, timeout=30)
    assert resp.status_code == 405
    resp = httpx.get(f"{stack.base}/execution/health", timeout=30)
    assert resp.status_code == 200


# --- (e) worker processes: the wrapper exits 0 on a stale launch, the stock entrypoint fails ---


def _workload(row, jwt_token: str):
    """The workload the scheduler would send for ``row`` (airflow-core's own constructor), with
    ``jwt_token`` as its token."""
    from sqlalchemy import select

    from airflow.executors.workloads import ExecuteTask
    from airflow.models.taskinstance import TaskInstance as TI
    from airflow.utils.session import create_session

    with create_session() as session:
        ti = session.scalar(select(TI).where(TI.id == uuid.UUID(row.id)))
        workload = ExecuteTask.make(ti, generator=_generator())
    workload.token = jwt_token
    return workload


def _spawn(stack: Stack, args: list[str]) -> subprocess.Popen:
    assert args[0] == "python"
    return subprocess.Popen([sys.executable, *args[1:]], env=stack.env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _stock_args(workload) -> list[str]:
    from airflow.providers.cncf.kubernetes.pod_generator import workload_to_command_args

    return workload_to_command_args(workload)


@pytest.mark.tasks("t1", "t2", "t3")
def test_worker_wrapper_exits_0_on_stale_launch_stock_fails(stack, world, capsys):
    sched, before = _queued(world)
    # 404 (410 on Airflow 3.4): the TI id this launch targets is no longer the task's live attempt
    gone_row = before["t2"]
    gone = _workload(gone_row, _claim(gone_row.id, gone_row.token))
    world.airflow.clear(gone_row)
    # not stale: a 409 invalid_state (TI already finished) keeps the stock exit code
    done_row = before["t3"]
    world.airflow.start(done_row)
    world.airflow.finish(done_row, "success")
    done = _workload(done_row, _claim(done_row.id, done_row.token))
    # 409: same id and try, re-queued with a new token
    old = before["t1"]
    stale = _workload(old, _claim(old.id, old.token))
    new = _requeued(world, sched)["t1"]
    assert new.id == old.id and new.token != old.token

    assert worker.command_args(stale)[:4] == ["python", "-c", worker.BOOTSTRAP, "--json-string"]
    assert worker.command_args(stale)[4] == _stock_args(stale)[4]
    procs = {
        "wrapper_409": _spawn(stack, worker.command_args(stale)),
        "stock_409": _spawn(stack, _stock_args(stale)),
        "wrapper_404": _spawn(stack, worker.command_args(gone)),
        "stock_404": _spawn(stack, _stock_args(gone)),
        "wrapper_done": _spawn(stack, worker.command_args(done)),
    }
    out = {}
    for name, p in procs.items():
        try:
            out[name] = (p.wait(150), p.stdout.read())
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            pytest.fail(f"{name} timed out")

    def stale_lines(text: str) -> list[str]:
        return [line for line in text.splitlines() if "stale executor launch" in line]

    code, text = out["wrapper_409"]
    assert code == 0, text
    [line] = stale_lines(text)
    assert old.id in line and metrics.short(old.token) in line and metrics.short(new.token) in line
    assert "stale_executor_launch" in line
    assert old.token not in text and new.token not in text
    assert _row(stack, old.id) == ("queued", "", new.token)  # never started
    with capsys.disabled():
        print("\nwrapper stale line:", line)

    code, text = out["wrapper_404"]
    assert code == 0, text
    [line] = stale_lines(text)
    assert gone_row.id in line and metrics.short(gone_row.token) in line and _gone()[1] in line

    for name in ("stock_409", "stock_404"):
        code, text = out[name]
        assert code != 0, f"{name}:\n{text}"
        assert not stale_lines(text)
        assert "ServerResponseError" in text
    assert "stale_executor_launch" in out["stock_409"][1]

    code, text = out["wrapper_done"]
    assert code == 1, text  # stock exit code for an ordinary 409 invalid_state
    assert not stale_lines(text) and "invalid_state" in text
    assert _row(stack, done_row.id)[0] == "success"


def _run_calls(stack: Stack, ti_id: str) -> int:
    """PATCH /run requests for ``ti_id`` the api-server finished (its access log)."""
    return sum(1 for line in stack.log.read_text(errors="replace").splitlines()
               if f"/task-instances/{ti_id}/run" in line and "PATCH" in line)


def _stopped_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if worker.STOPPED in line]


def _until_line(proc: subprocess.Popen, marker: str, timeout: float = 150) -> list[str]:
    """The process's output up to and including the first line holding ``marker``."""
    seen, deadline = [], time.monotonic() + timeout
    for line in proc.stdout:
        seen.append(line)
        if marker in line or time.monotonic() > deadline:
            break
    assert seen and marker in seen[-1], "".join(seen)[-3000:]
    return seen


def _finish(proc: subprocess.Popen, seen: list[str], timeout: float = 120) -> tuple[int, str]:
    try:
        rest = proc.communicate(timeout=timeout)[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("the worker did not exit after SIGTERM")
    return proc.returncode, "".join(seen) + rest


@pytest.mark.tasks("t1", "t2")
def test_worker_told_to_stop_before_run_exits_0_without_calling_run(stack, world):
    """A revoked (or drained) pod gets SIGTERM while its worker starts. Before: the signal killed
    it (exit 143, pod Failed) or, on Airflow 3.4 when it came during the Task SDK's start, /run was
    sent anyway. Now it exits 0 with one line and never sends /run; the task stays queued."""
    _, rows = _queued(world)
    runs = {}
    for task, args in (("t1", worker.command_args), ("t2", _stock_args)):
        row = rows[task]
        proc = _spawn(stack, args(_workload(row, _claim(row.id, row.token))))
        # Logged once the entrypoint's imports are done; the supervisor module, its client and the
        # task process it forks all come before /run.
        seen = _until_line(proc, "Executing workload")
        os.killpg(proc.pid, signal.SIGTERM)
        runs[task] = (row, *_finish(proc, seen))

    row, code, text = runs["t1"]
    assert code == 0, text[-3000:]
    [line] = _stopped_lines(text)
    assert "stopped_before_run" in line and "SIGTERM" in line
    assert row.token not in text
    assert _run_calls(stack, row.id) == 0
    assert _row(stack, row.id) == ("queued", "", row.token)

    row, code, text = runs["t2"]  # the stock entrypoint: the signal's default action
    assert code == -signal.SIGTERM, text[-3000:]
    assert not _stopped_lines(text)


@pytest.mark.tasks("t1", "t2")
def test_worker_whose_run_is_refused_after_sigterm_exits_0(stack, world):
    """Issue 47: on Airflow 3.4 a pod deleted by the stuck-in-queued revoke while its /run was in
    flight kept going (the Task SDK's warm shutdown), core answered 409 ``invalid_state`` (the task
    was back in SCHEDULED) and the worker exited 1. The /run here waits on the task's row lock (a
    locking read by the test, standing for any slow start) while the pod gets SIGTERM.

    Now that refusal ends in the stop line and exit 0. Before 3.4 a signal during /run kills the
    worker, stock and fenced alike (the default action: nothing here changes it)."""
    import sqlalchemy as sa

    from fenced_k8s_executor import provider_compat

    sched, rows = _queued(world)
    workloads = {t: _workload(rows[t], _claim(rows[t].id, rows[t].token)) for t in ("t1", "t2")}
    sched.stuck_in_queued()  # core revokes both launches: SCHEDULED, same id, try and token
    assert all(_row(stack, rows[t].id)[0] == "scheduled" for t in rows)
    warm = provider_compat.task_columns().live is not None  # Airflow 3.4: the SDK's warm shutdown
    env = {**stack.env, "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "120"}  # no client retry meanwhile
    engine = sa.create_engine(stack.url, poolclass=sa.pool.NullPool)
    results = {}
    try:
        for task, args in (("t1", worker.command_args), ("t2", _stock_args)):
            row = rows[task]
            with engine.connect() as lock:
                lock.exec_driver_sql("SELECT id FROM task_instance WHERE id = %s FOR UPDATE", (row.id,))
                proc = subprocess.Popen([sys.executable, *args(workloads[task])[1:]], env=env, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
                deadline = time.monotonic() + 150
                while not _waits_on_a_row_lock(engine):  # the route's locked read of the row
                    if proc.poll() is not None or time.monotonic() > deadline:
                        os.killpg(proc.pid, signal.SIGKILL)
                        pytest.fail(f"{task}: /run never waited on the row:\n{proc.communicate()[0][-3000:]}")
                    time.sleep(0.2)
                os.killpg(proc.pid, signal.SIGTERM)
                seen = _until_line(proc, "warm shutdown") if warm else []
                lock.rollback()  # the route goes on: the task is SCHEDULED, /run is refused
            results[task] = _finish(proc, seen)
    finally:
        engine.dispose()

    code, text = results["t1"]
    if warm:
        assert code == 0, text[-3000:]
        [line] = _stopped_lines(text)
        assert "stopped_during_run" in line and "409" in line and "SIGTERM" in line
        code, text = results["t2"]
        assert code == 1 and "invalid_state" in text, text[-3000:]
    else:
        assert code == -signal.SIGTERM and not _stopped_lines(text), text[-3000:]
        assert results["t2"][0] == -signal.SIGTERM, results["t2"][1][-3000:]
    assert all(_row(stack, rows[t].id)[0] == "scheduled" for t in rows)


def _waits_on_a_row_lock(engine) -> bool:
    with engine.connect() as conn:
        return bool(conn.exec_driver_sql(
            "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query ILIKE %s"
            " AND pid <> pg_backend_pid()", ("%task_instance%",)).first())


# --- (f) run_gate off: the middleware is not installed ------------------------------------------


_LIST_MIDDLEWARE = """
from airflow.api_fastapi.app import create_app
app = create_app()
print("MIDDLEWARE=" + ",".join(m.cls.__name__ for m in app.user_middleware))
"""


def test_middleware_installed_only_when_run_gate_is_true(stack, tmp_path):
    procs = {}
    for flag in (True, False):
        env = _airflow_env(stack.url, tmp_path / str(flag), stack.port, run_gate=flag)
        procs[flag] = subprocess.Popen([sys.executable, "-c", _LIST_MIDDLEWARE], env=env, text=True,
                                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    found = {}
    for flag, p in procs.items():
        text = p.communicate(timeout=120)[0]
        assert p.returncode == 0, text
        [line] = [x for x in text.splitlines() if x.startswith("MIDDLEWARE=")]
        found[flag] = line.split("=", 1)[1].split(",")
    assert "FencedRunGateMiddleware" in found[True]
    assert "FencedRunGateMiddleware" not in found[False]
    assert set(found[True]) - {"FencedRunGateMiddleware"} == set(found[False])


# --- latency of the gate on /run (reported, never asserted) --------------------------------------


@pytest.mark.tasks("t1", "t2")
def test_report_run_gate_latency(stack, world, capsys):
    """Repeated /run of a RUNNING TI by the same client is the route's idempotent 200
    ("duplicate start"), so the same request can be timed many times with and without a claim."""
    import httpx

    n = 60
    _, rows = _queued(world)
    ti_claim, ti_plain = rows["t1"], rows["t2"]
    jwt_claim, jwt_plain = _claim(ti_claim.id, ti_claim.token), _stock(ti_plain.id)
    body = {**RUN_PAYLOAD, "start_date": datetime.now(tz=timezone.utc).isoformat()}
    samples = {"claim": [], "no_claim": []}
    with httpx.Client(timeout=60) as client:
        def once(ti_id, token):
            t0 = time.perf_counter()
            r = client.patch(f"{stack.base}/execution/task-instances/{ti_id}/run", json=body,
                             headers={"Authorization": f"Bearer {token}"})
            assert r.status_code == 200, r.text
            return time.perf_counter() - t0

        once(ti_claim.id, jwt_claim), once(ti_plain.id, jwt_plain)
        for _ in range(n):
            samples["claim"].append(once(ti_claim.id, jwt_claim))
            samples["no_claim"].append(once(ti_plain.id, jwt_plain))
    med = {k: statistics.median(v) * 1000 for k, v in samples.items()}
    p90 = {k: sorted(v)[int(len(v) * 0.9)] * 1000 for k, v in samples.items()}
    report = {
        "n": n,
        "median_ms": {k: round(v, 2) for k, v in med.items()},
        "p90_ms": {k: round(v, 2) for k, v in p90.items()},
        "gate_overhead_median_ms": round(med["claim"] - med["no_claim"], 2),
    }
    with capsys.disabled():
        print("\nrun_gate latency on PATCH /run:", json.dumps(report))


# --- the middleware alone, in process (real validator, real ASGI calls, no DB) ------------------


def _asgi_call(middleware, method: str, path: str, headers: dict, body_chunks: list[bytes]):
    import asyncio

    received_by_app = []
    sent = []
    chunks = list(body_chunks)

    async def receive():
        if chunks:
            return {"type": "http.request", "body": chunks.pop(0), "more_body": bool(chunks)}
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http", "method": method, "path": path, "root_path": "", "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }
    asyncio.run(middleware(scope, receive, send))
    return received_by_app, sent, chunks


def _validator():
    from airflow.api_fastapi.auth.tokens import JWTValidator

    return JWTValidator(secret_key=SECRET, audience=[AUDIENCE], issuer=None,
                        required_claims=frozenset({"aud", "exp", "iat"}), algorithm=["HS512"], leeway=0)


class _Downstream:
    """A real ASGI app standing for the api-server: streams the request body through."""

    def __init__(self):
        self.calls = 0
        self.body = b""

    async def __call__(self, scope, receive, send):
        self.calls += 1
        while True:
            msg = await receive()
            self.body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"downstream"})


def test_gate_db_error_passes_the_request_through():
    from sqlalchemy.exc import OperationalError

    from fenced_k8s_executor.run_gate import FencedRunGateMiddleware

    def broken_db(ti_id):
        raise OperationalError("SELECT", {}, Exception("connection refused"))

    app = _Downstream()
    ti_id, token = str(uuid.uuid4()), str(uuid.uuid4())
    mw = FencedRunGateMiddleware(app, validator=_validator(), row_token_reader=broken_db)
    _, sent, _ = _asgi_call(mw, "PATCH", f"/execution/task-instances/{ti_id}/run",
                            {"Authorization": f"Bearer {_claim(ti_id, token)}"}, [b'{"a":', b"1}"])
    assert app.calls == 1 and app.body == b'{"a":1}'
    assert sent[0]["status"] == 200


def test_gate_rejects_in_process_without_reading_the_body():
    from fenced_k8s_executor.run_gate import FencedRunGateMiddleware

    old, new = str(uuid.uuid4()), str(uuid.uuid4())
    ti_id = str(uuid.uuid4())
    reads = []

    def row_token(tid):
        reads.append(tid)
        return new

    app = _Downstream()
    mw = FencedRunGateMiddleware(app, validator=_validator(), row_token_reader=row_token)
    _, sent, left = _asgi_call(mw, "PATCH", f"/airflow/execution/task-instances/{ti_id}/run",
                               {"Authorization": f"Bearer {_claim(ti_id, old)}"}, [b"{}"])
    assert app.calls == 0 and left == [b"{}"]  # body never read
    assert sent[0]["status"] == 409
    assert json.loads(sent[1]["body"])["detail"]["current_launch"] == metrics.short(new)
    assert [str(t) for t in reads] == [ti_id]  # exactly one lookup, by primary key

    # other methods / paths / no claim: no lookup at all
    for method, path, jwt_token in (
        ("POST", f"/execution/task-instances/{ti_id}/run", _claim(ti_id, old)),
        ("PATCH", f"/execution/task-instances/{ti_id}/state", _claim(ti_id, old)),
        ("PATCH", f"/execution/task-instances/{ti_id}/run", _stock(ti_id)),
    ):
        app = _Downstream()
        mw = FencedRunGateMiddleware(app, validator=_validator(), row_token_reader=row_token)
        _asgi_call(mw, method, path, {"Authorization": f"Bearer {jwt_token}"}, [b"{}"])
        assert app.calls == 1
    assert len(reads) == 1
