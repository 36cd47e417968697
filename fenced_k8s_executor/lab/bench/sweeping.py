"""Scenario 4: one ``Sweeper.run_once()`` over 100 / 1,000 / 10,000 executor pods."""

from __future__ import annotations

import asyncio
import json
import uuid

from fenced_k8s_executor.lab.bench.env import Lab, median, progress
from fenced_k8s_executor.launch import LaunchIdentity
from fenced_k8s_executor.sweep import Sweeper


DEPLOYMENT = "bench-deployment"


def pod_body(ti: tuple, token: str, job_id: int = 1) -> dict:
    """An executor pod of a fenced scheduler of deployment ``DEPLOYMENT``."""
    ti_id, dag_id, task_id, run_id = ti
    launch = LaunchIdentity(ti_id=ti_id, token=token, try_number=1, scheduler_job_id=str(job_id),
                            dag_id=dag_id, task_id=task_id, run_id=run_id, deployment=DEPLOYMENT)
    name = f"{dag_id}-{task_id}-{uuid.uuid4().hex[:10]}".replace("_", "-")
    labels = {"kubernetes_executor": "True", "airflow-worker": str(job_id), "dag_id": dag_id, "task_id": task_id,
              "try_number": "1", "run_id": run_id, **launch.labels()}
    annotations = {"dag_id": dag_id, "task_id": task_id, "try_number": "1", "run_id": run_id,
                   **launch.annotations()}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels, "annotations": annotations},
            "spec": {"restartPolicy": "Never", "containers": [{"name": "base", "image": "lab/airflow:local"}]}}


def create_pods(lab: Lab, namespace: str, bodies: list[dict], concurrency: int = 48) -> None:
    """Bulk-create pods with concurrent POSTs (aiohttp) against the emulator."""
    import aiohttp

    url = f"{lab.emu_url}/api/v1/namespaces/{namespace}/pods"
    headers = {"Authorization": "Bearer bench-setup", "Content-Type": "application/json"}
    lab.emu.set_tokens({"bench-setup": "bench-setup"})

    async def run() -> None:
        sem = asyncio.Semaphore(concurrency)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
            async def one(body: dict) -> None:
                async with sem:
                    async with session.post(url, data=json.dumps(body), headers=headers) as resp:
                        if resp.status != 201:
                            raise RuntimeError(f"create pod: {resp.status} {await resp.text()}")

            await asyncio.gather(*(one(b) for b in bodies))

    asyncio.run(run())


def sweep(lab: Lab, sizes: list[int], reps: int, stale_fraction: float, page_size: int) -> dict:
    import sqlalchemy as sa

    with lab.engine.connect() as conn:
        rows = conn.execute(sa.text(
            "SELECT id, dag_id, task_id, run_id, external_executor_id FROM task_instance"
            " WHERE dag_id LIKE 'bench_dag_%' ORDER BY id LIMIT :n"), {"n": max(sizes)}).all()
    if len(rows) < max(sizes):
        raise RuntimeError(f"need {max(sizes)} seeded TIs for the sweep, have {len(rows)}")
    out: dict = {"raw": {}, "seconds": {}, "api_calls": {}, "db_queries": {}, "pages": {}, "deleted": {},
                 "stale_fraction": stale_fraction, "page_size": page_size}
    for size in sizes:
        ns = f"bench-sweep-{size}"
        n_stale = max(1, int(size * stale_fraction))
        current = [pod_body((str(r[0]), r[1], r[2], r[3]), r[4]) for r in rows[n_stale:size]]
        stale = [pod_body((str(r[0]), r[1], r[2], r[3]), str(uuid.uuid4())) for r in rows[:n_stale]]
        progress(f"sweep: creating {size} pods ({n_stale} stale) in the emulator")
        create_pods(lab, ns, current + stale)
        sweeper = Sweeper(kube_client=lab.core_api("sweeper", ns), namespaces=[ns], interval=0,
                          page_size=page_size, enforcing=True, deployment=DEPLOYMENT)
        samples = []
        for rep in range(reps + 1):  # rep 0: warm-up
            if rep > 0:
                create_pods(lab, ns, stale)  # the previous sweep deleted them
            mark, before = lab.audit_mark(), lab.trips.snapshot()
            report = sweeper.run_once()
            db = lab.trips.since(before)
            calls = lab.api_calls(mark, who="sweeper")
            if report.errors or report.deleted != n_stale or report.pods_seen != size:
                raise RuntimeError(f"sweep of {size}: {report}")
            if rep > 0:
                samples.append({"seconds": report.seconds, "pages": report.pages, "deleted": report.deleted,
                                "db": db, "api_calls": len(calls),
                                "api_lists": sum(1 for c in calls if c.get("verb") == "list"),
                                "api_deletes": sum(1 for c in calls if c.get("verb") == "delete")})
        key = str(size)
        out["raw"][key] = samples
        out["seconds"][key] = median([s["seconds"] for s in samples])
        out["api_calls"][key] = {"total": samples[0]["api_calls"], "list": samples[0]["api_lists"],
                                 "delete": samples[0]["api_deletes"]}
        out["db_queries"][key] = samples[0]["db"]["statements"]
        out["pages"][key] = samples[0]["pages"]
        out["deleted"][key] = samples[0]["deleted"]
        progress(f"sweep {size} pods: {out['seconds'][key]:.3f}s, {out['pages'][key]} pages,"
                 f" API {out['api_calls'][key]}, {out['db_queries'][key]} DB statements")
    return out
