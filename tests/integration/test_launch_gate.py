"""Launch gate end to end: real PostgreSQL with Airflow's schema, a real `airflow api-server`
(plugin loaded from the package's entry point) and real worker processes. No mocks.

One api-server serves every test in this module (start-up dominates the runtime).
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
DAG_ID = "gate_dag"
RUN_ID = "manual__gate"
BUNDLE = "dags-folder"
RUN_PAYLOAD = {"state": "running", "hostname": "gate-host", "unixname": "gate", "pid": 4242}


@dataclass
class Stack:
    base: str
    env: dict
    port: int
    pg_port: int
    dbname: str
    dag_version_id: str
    log: Path

    def sql(self, query: str, params: tuple = ()) -> list:
        import psycopg2

        conn = psycopg2.connect(host="127.0.0.1", port=self.pg_port, user="postgres", dbname=self.dbname)
        try:
            conn.autocommit = True
            with conn.cursor() as cur:
                cur.execute(query, params)
                return cur.fetchall() if cur.description else []
        finally:
            conn.close()


def _generator():
    from airflow.api_fastapi.auth.tokens import JWTGenerator

    return JWTGenerator(secret_key=SECRET, audience=AUDIENCE, valid_for=600, issuer=None, algorithm="HS512", kid="not-used")


def _airflow_env(url: str, home: Path, port: int, *, run_gate: bool = True) -> dict:
    from cryptography.fernet import Fernet

    from fenced_k8s_executor.lab.postgres import airflow_db_env

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


def _seed(stack_sql, dag_version_id: str) -> None:
    stack_sql(f"INSERT INTO dag_bundle(name) VALUES ('{BUNDLE}') ON CONFLICT DO NOTHING")
    stack_sql(
        "INSERT INTO dag(dag_id, is_paused, is_stale, bundle_name, timetable_type, partition_mapper_info,"
        " max_active_tasks, max_consecutive_failed_dag_runs, has_task_concurrency_limits, owners)"
        " VALUES (%s, false, false, %s, '', '{}', 16, 0, false, 'gate')",
        (DAG_ID, BUNDLE),
    )
    stack_sql(
        "INSERT INTO dag_version(id, version_number, dag_id, bundle_name, created_at, last_updated)"
        " VALUES (%s, 1, %s, %s, now(), now())",
        (dag_version_id, DAG_ID, BUNDLE),
    )
    stack_sql(
        "INSERT INTO dag_run(dag_id, run_id, run_type, run_after, state, logical_date, start_date,"
        " created_dag_version_id) VALUES (%s, %s, 'manual', now(), 'running', now(), now(), %s)",
        (DAG_ID, RUN_ID, dag_version_id),
    )


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    import httpx

    from fenced_k8s_executor.lab import postgres as labpg

    srv = labpg.start_from_template()
    proc = None
    try:
        dbname = f"gate_{uuid.uuid4().hex[:8]}"
        url = labpg.new_airflow_db(srv, dbname)
        home = tmp_path_factory.mktemp("airflow_home")
        port = labpg.free_port()
        env = _airflow_env(url, home, port)
        st = Stack(base=f"http://127.0.0.1:{port}", env=env, port=port, pg_port=srv.port, dbname=dbname,
                   dag_version_id=str(uuid.uuid4()), log=home / "api-server.log")
        _seed(st.sql, st.dag_version_id)
        with open(st.log, "wb") as logf:
            proc = subprocess.Popen(
                [sys.executable, "-m", "airflow", "api-server", "-H", "127.0.0.1", "-p", str(port)],
                env=env, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True,
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
        warm = _insert_ti(st, str(uuid.uuid4()))
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
        srv.stop()


def _insert_ti(stack: Stack, token: str | None, *, state: str = "queued", task_id: str | None = None) -> str:
    ti_id = str(uuid.uuid4())
    stack.sql(
        "INSERT INTO task_instance(id, task_id, dag_id, run_id, map_index, try_number, max_tries, pool,"
        " pool_slots, state, queue, priority_weight, dag_version_id, external_executor_id)"
        " VALUES (%s, %s, %s, %s, -1, 1, 0, 'default_pool', 1, %s, 'default', 1, %s, %s)",
        (ti_id, task_id or f"t_{ti_id[:8]}", DAG_ID, RUN_ID, state, stack.dag_version_id, token),
    )
    return ti_id


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


def _stock(ti_id: str) -> str:
    from airflow.executors.workloads.base import BaseWorkloadSchema

    return BaseWorkloadSchema.generate_token(ti_id, _generator())


# --- (a) the current launch: stock behaviour ------------------------------------------------


def test_run_with_current_claim_starts_the_task(stack):
    token = str(uuid.uuid4())
    ti_id = _insert_ti(stack, token)
    resp = _run(stack, ti_id, _claim(ti_id, token))
    assert resp.status_code == 200, resp.text
    assert resp.json()["max_tries"] == 0
    assert resp.headers.get("Refreshed-API-Token")  # the route's workload -> execution swap ran
    assert _row(stack, ti_id)[:2] == ("running", "gate-host")


# --- (b) a superseded launch of the same id and try: 409, not started -------------------------


def test_run_with_stale_claim_is_rejected_and_not_started(stack):
    old, new = str(uuid.uuid4()), str(uuid.uuid4())
    ti_id = _insert_ti(stack, old)
    stack.sql("UPDATE task_instance SET external_executor_id = %s WHERE id = %s", (new, ti_id))  # re-queued

    resp = _run(stack, ti_id, _claim(ti_id, old))
    assert resp.status_code == 409, resp.text
    assert resp.json() == {
        "detail": {
            "reason": "stale_executor_launch",
            "message": resp.json()["detail"]["message"],
            "ti_id": ti_id,
            "launch": metrics.short(old),
            "current_launch": metrics.short(new),
        }
    }
    assert old not in resp.text and new not in resp.text
    assert _row(stack, ti_id) == ("queued", None, new)

    # the current launch still starts
    resp = _run(stack, ti_id, _claim(ti_id, new))
    assert resp.status_code == 200, resp.text
    assert _row(stack, ti_id)[0] == "running"


def test_stale_claim_on_a_running_ti_is_rejected(stack):
    """The stale pod comes late, after the current launch started: still refused."""
    old, new = str(uuid.uuid4()), str(uuid.uuid4())
    ti_id = _insert_ti(stack, new)
    assert _run(stack, ti_id, _claim(ti_id, new)).status_code == 200
    resp = _run(stack, ti_id, _claim(ti_id, old))  # same hostname/pid: stock would say "duplicate, 200"
    assert resp.status_code == 409 and resp.json()["detail"]["reason"] == "stale_executor_launch"


# --- (c) unknown ids: stock 404 ----------------------------------------------------------------


def test_run_for_unknown_ti_is_stock_404(stack):
    ti_id = str(uuid.uuid4())
    resp = _run(stack, ti_id, _claim(ti_id, str(uuid.uuid4())))
    assert resp.status_code == 404
    assert resp.json()["detail"]["reason"] == "not_found"


# --- (d) untouched: no claim, legacy rows, invalid tokens -------------------------------------


def test_run_without_claim_is_untouched(stack):
    ti_id = _insert_ti(stack, str(uuid.uuid4()))  # row token the request cannot name
    resp = _run(stack, ti_id, _stock(ti_id))
    assert resp.status_code == 200, resp.text
    assert _row(stack, ti_id)[0] == "running"


def test_legacy_row_is_not_fenced(stack):
    ti_id = _insert_ti(stack, "17")  # the stock executor writes its job id there
    resp = _run(stack, ti_id, _claim(ti_id, str(uuid.uuid4())))
    assert resp.status_code == 200, resp.text


def test_invalid_jwt_with_claim_gets_the_routes_own_answer(stack):
    from airflow.api_fastapi.auth.tokens import JWTGenerator

    old, new = str(uuid.uuid4()), str(uuid.uuid4())
    ti_id = _insert_ti(stack, new)
    forged_gen = JWTGenerator(secret_key="not-the-secret-" + "q" * 64, audience=AUDIENCE, valid_for=60,
                              issuer=None, algorithm="HS512", kid="not-used")
    forged = launch_claim.mint(forged_gen, ti_id=ti_id, token=old, valid_for=60)
    resp = _run(stack, ti_id, forged)
    assert resp.status_code == 403 and resp.json()["detail"] == "Invalid auth token"
    assert _run(stack, ti_id, None).status_code in (401, 403)  # the route's own answer, unchanged
    # a claim for another TI id: the route's ti:self check answers, not the gate
    other = _insert_ti(stack, str(uuid.uuid4()))
    resp = _run(stack, ti_id, _claim(other, old))
    assert resp.status_code == 403 and "does not match" in resp.text
    assert _row(stack, ti_id)[0] == "queued"


def test_other_methods_and_paths_are_untouched(stack):
    import httpx

    old, new = str(uuid.uuid4()), str(uuid.uuid4())
    ti_id = _insert_ti(stack, new)
    headers = {"Authorization": f"Bearer {_claim(ti_id, old)}"}
    # GET on /run: the route table answers 405, the gate does not look at it
    resp = httpx.get(f"{stack.base}/execution/task-instances/{ti_id}/run", headers=headers, timeout=30)
    assert resp.status_code == 405
    resp = httpx.get(f"{stack.base}/execution/health", timeout=30)
    assert resp.status_code == 200


# --- (e) worker processes: the wrapper exits 0 on a stale launch, the stock entrypoint fails ---


def _workload(stack: Stack, ti_id: str, jwt_token: str):
    from airflow.executors.workloads import ExecuteTask
    from airflow.executors.workloads.base import BundleInfo
    from airflow.executors.workloads.task import TaskInstanceDTO

    ti = TaskInstanceDTO(id=ti_id, task_id=f"t_{ti_id[:8]}", dag_id=DAG_ID, run_id=RUN_ID, try_number=1,
                         dag_version_id=stack.dag_version_id, pool_slots=1, priority_weight=1, queue="default")
    return ExecuteTask(token=jwt_token, ti=ti, dag_rel_path="gate_dag.py",
                       bundle_info=BundleInfo(name=BUNDLE, version=None), log_path=None)


def _spawn(stack: Stack, args: list[str]) -> subprocess.Popen:
    assert args[0] == "python"
    return subprocess.Popen([sys.executable, *args[1:]], env=stack.env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def _stock_args(workload) -> list[str]:
    from airflow.providers.cncf.kubernetes.pod_generator import workload_to_command_args

    return workload_to_command_args(workload)


def test_worker_wrapper_exits_0_on_stale_launch_stock_fails(stack, capsys):
    # 409: same id and try, re-queued with a new token
    old, new = str(uuid.uuid4()), str(uuid.uuid4())
    stale_ti = _insert_ti(stack, old)
    stack.sql("UPDATE task_instance SET external_executor_id = %s WHERE id = %s", (new, stale_ti))
    stale = _workload(stack, stale_ti, _claim(stale_ti, old))
    # 404: the TI id this launch targets no longer exists (cleared -> new id)
    gone_ti, gone_token = str(uuid.uuid4()), str(uuid.uuid4())
    gone = _workload(stack, gone_ti, _claim(gone_ti, gone_token))
    # not stale: a 409 invalid_state (TI already finished) keeps the stock exit code
    done_token = str(uuid.uuid4())
    done_ti = _insert_ti(stack, done_token, state="success")
    done = _workload(stack, done_ti, _claim(done_ti, done_token))

    assert worker.command_args(stale)[:4] == ["python", "-m", "fenced_k8s_executor.worker", "--json-string"]
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
    assert stale_ti in line and metrics.short(old) in line and metrics.short(new) in line
    assert "stale_executor_launch" in line
    assert old not in text and new not in text
    assert _row(stack, stale_ti) == ("queued", None, new)  # never started
    with capsys.disabled():
        print("\nwrapper stale line:", line)

    code, text = out["wrapper_404"]
    assert code == 0, text
    [line] = stale_lines(text)
    assert gone_ti in line and metrics.short(gone_token) in line and "ti_not_found" in line

    for name in ("stock_409", "stock_404"):
        code, text = out[name]
        assert code != 0, f"{name}:\n{text}"
        assert not stale_lines(text)
        assert "ServerResponseError" in text
    assert "stale_executor_launch" in out["stock_409"][1]

    code, text = out["wrapper_done"]
    assert code == 1, text  # stock exit code for an ordinary 409 invalid_state
    assert not stale_lines(text) and "invalid_state" in text
    assert _row(stack, done_ti)[0] == "success"


# --- (f) run_gate off: the middleware is not installed ------------------------------------------


_LIST_MIDDLEWARE = """
from airflow.api_fastapi.app import create_app
app = create_app()
print("MIDDLEWARE=" + ",".join(m.cls.__name__ for m in app.user_middleware))
"""


def test_middleware_installed_only_when_run_gate_is_true(stack, tmp_path):
    procs = {}
    for flag in (True, False):
        env = _airflow_env(stack.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"], tmp_path / str(flag), stack.port,
                           run_gate=flag)
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


def test_report_run_gate_latency(stack, capsys):
    """Repeated /run of a RUNNING TI by the same client is the route's idempotent 200
    ("duplicate start"), so the same request can be timed many times with and without a claim."""
    import httpx

    n = 60
    with_claim, without = str(uuid.uuid4()), str(uuid.uuid4())
    ti_claim = _insert_ti(stack, with_claim)
    ti_plain = _insert_ti(stack, without)
    jwt_claim, jwt_plain = _claim(ti_claim, with_claim), _stock(ti_plain)
    body = {**RUN_PAYLOAD, "start_date": datetime.now(tz=timezone.utc).isoformat()}
    samples = {"claim": [], "no_claim": []}
    with httpx.Client(timeout=60) as client:
        def once(ti_id, token):
            t0 = time.perf_counter()
            r = client.patch(f"{stack.base}/execution/task-instances/{ti_id}/run", json=body,
                             headers={"Authorization": f"Bearer {token}"})
            assert r.status_code == 200, r.text
            return time.perf_counter() - t0

        once(ti_claim, jwt_claim), once(ti_plain, jwt_plain)
        for _ in range(n):
            samples["claim"].append(once(ti_claim, jwt_claim))
            samples["no_claim"].append(once(ti_plain, jwt_plain))
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
