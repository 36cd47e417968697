"""Issue 52: a copy of production's metadata database never touches production's pods, whenever it
was taken, and production never touches the copy's.

Operators copy the metadata database all the time (a staging clone, a snapshot restored for a DR
drill, a point-in-time restore beside the original), and the copy carries the deployment id and
every row, heartbeats included: what a database says about itself is copied with it. Each test
takes a real physical copy of the test's PostgreSQL (``pg_basebackup``, ``fenced_k8s_lab.pgops``) at
one moment, starts the copy's own scheduler in a process of its own in the same namespace (its
metadata DB the copy), lets both loop as schedulers do (heartbeats included) and checks, in the API
server's audit, that neither deleted nor patched a pod of the other. Stock runs each moment too:
its result is asserted beside, as it is.

On the code before the witness (launcher heartbeat stamps), the copy deleted the original's pods
in every moment but the last two: a pod names a heartbeat the copy already holds (a copy taken
between two heartbeats), or was launched before the copy by a scheduler that is dead in the copy.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from datetime import timedelta
from dataclasses import dataclass, field
from typing import Any, Iterator

import pytest

KINDS = ["stock", "fenced"]
#: Liveness as airflow-core's defaults have it (5 s and 30 s), scaled down: a heartbeat every
#: 0.3 s, a scheduler dead after 2 s without one.
HEARTBEAT_SEC, ALIVE_FOR = "0.3", "2"
#: Seconds for a scheduler the copy inherited to be dead there, and then some loops.
DEAD_THERE = 3.0
TOUCHING = ("delete", "patch", "update", "deletecollection")


@dataclass
class Copies:
    """Physical copies of the world's metadata DB and the schedulers that run on them."""

    world: Any
    pg_server: Any
    database: str
    servers: list = field(default_factory=list)

    def take(self) -> str:
        """A copy of the whole server, now (its consistent point: when the call returns); the URL
        of the world's database on it."""
        from fenced_k8s_lab import pgops

        clone = pgops.cloned(self.pg_server)
        self.servers.append(clone)
        return clone.url(self.database)

    def scheduler(self, kind: str, url: str, hostname: str = "staging-scheduler", **env: str):
        """The copy's own scheduler (``scheduler_child.py --serve``): it queues its copy of the run,
        creates pods, loops and heartbeats against the copy (``env``: its settings beside)."""
        since = len(self.world.audit())
        child = self.world.scheduler_process(kind, hostname=hostname, serve=True,
                                             env={"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": url, **env})
        child.audit_from = since
        return child

    def stop(self) -> None:
        for server in self.servers:
            server.stop()


@pytest.fixture
def copies(world, pg_server, metadata_db, monkeypatch, request):
    if request.node.callspec.params.get("kind") == "stock" and world.backend.name == "real":
        pytest.skip("stock's result is asserted on the emulator (its copy's calls are the same on both)")
    monkeypatch.setenv("AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC", HEARTBEAT_SEC)
    monkeypatch.setenv("AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD", ALIVE_FOR)
    found = Copies(world, pg_server, metadata_db.url.database)
    yield found
    for child in world.children:  # before their database goes
        child.kill()
    found.stop()


@contextmanager
def looping(origin) -> Iterator[None]:
    """The original scheduler lives meanwhile: its loop (executor sync, heartbeat) in a thread, as
    ``airflow scheduler`` runs it, until the block ends."""
    stop = threading.Event()
    failures: list[BaseException] = []

    def run() -> None:
        while not stop.is_set():
            try:
                origin.executor.sync()
                origin.heartbeat()
            except BaseException as error:  # noqa: BLE001 - surfaced when the block ends
                failures.append(error)
                return
            stop.wait(0.2)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not failures, f"the original's loop failed: {failures[0]!r}"


def live(world) -> set[str]:
    return {p.metadata.name for p in world.live_pods()}


def touches(world, who: str, names: set[str], since: int = 0) -> list[dict]:
    """Deletes and patches ``who`` sent to any of the pods ``names`` from audit entry ``since`` on (the
    real apiserver's audit is written when a response completes: looked at for up to 2 s)."""
    deadline = time.monotonic() + (2.0 if world.backend.name == "real" else 0)
    while True:
        found = [e for e in world.audit() if e.get("who") == who and e.get("verb") in TOUCHING
                 and e.get("resource", "pods") == "pods" and e.get("name") in names and e["index"] >= since]
        if found or time.monotonic() >= deadline:
            return found
        time.sleep(0.2)


def assert_apart(world, origin, copy, ours: set[str], *, kind: str, stock: set[str] = frozenset()) -> set[str]:
    """Neither touched the other's pods once the copy's scheduler ran (stock's copy does what
    ``stock`` names: its adoption relabels the original's pods, its revoke then deletes them);
    the copy launched pods of its own. Returns the copy's pods."""
    theirs = live(world) - ours
    by_copy = touches(world, copy.user, ours)
    if kind == "stock":
        assert {e["verb"] for e in by_copy} == set(stock), f"stock's copy: {by_copy}"
    else:
        assert not by_copy, f"{kind}: the copy touched the original's pods: {by_copy}"
        assert ours <= live(world), f"{kind}: the original's pods are gone: {ours - live(world)}"
    # Names are deterministic per launch: the copy may launch again what the original launched and
    # deleted before the copy's scheduler ran; only what the original did since counts.
    assert not touches(world, origin.user, theirs, since=copy.audit_from), \
        f"{kind}: the original touched the copy's pods"
    return theirs


def running_original(world, kind, running=("t2", "t4")):
    """The original's scheduler, which launched the world's tasks: ``running`` started in their pods,
    the others Pending, then a heartbeat."""
    origin = world.scheduler(kind)
    world.queue(origin)
    origin.executor.sync()
    for task in running:
        world.start_in_pod(task)
    origin.heartbeat()
    return origin


def _wait_for_heartbeats_past_its_post(world, origin, seconds: float, kind: str) -> None:
    """Until the original's database holds a heartbeat ``seconds`` past the last one it posted in the
    witness (stock posts none: ``seconds`` of its loops)."""
    from fenced_k8s_executor.witness import entries

    if kind == "stock":
        return settle(seconds)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        posted = [e.heartbeat for lease in world.backend.leases(world.namespace)
                  for e in entries(lease["metadata"].get("annotations")) if e.job_id == origin.job_id]
        beat = origin.job.latest_heartbeat
        if posted and beat is not None and (beat.replace(tzinfo=posted[0].tzinfo) if beat.tzinfo is None else beat) \
                - max(posted) > timedelta(seconds=seconds):
            return
        time.sleep(0.2)
    raise AssertionError("the original never heartbeat past its last post: the scenario did not happen")


def said_collision(world, child) -> bool:
    text = (world.tmp_path / f"{child.user}.log").read_text() + (world.tmp_path / f"{child.user}.out").read_text()
    return "deployment id collision" in text


def settle(seconds: float) -> None:
    time.sleep(seconds)


@pytest.mark.tasks("t1", "t2", "t3")
@pytest.mark.parametrize("kind", KINDS)
def test_a_copy_taken_between_two_heartbeats_never_touches_the_originals_pods(world, copies, kind, monkeypatch):
    """Issue 52's first probe: the copy is taken right after a heartbeat; the original launches
    three tasks before its next one; the copy's scheduler starts and queues its copy of the run
    under tokens of its own while the original's last heartbeat is still the one the copy holds
    (the original's scheduler live and level with the copy: the witness cannot tell it from one of
    the copy's own yet), then the original heartbeats on. The original's pods name a scheduler the
    copy holds: before the witness, the copy took them for its own superseded launches and deleted
    all three. Stock deleted none."""
    monkeypatch.setenv("AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD", "30")  # live through the copy's start
    origin = world.scheduler(kind)
    origin.heartbeat()
    snapshot = copies.take()
    world.queue(origin)  # no heartbeat between the copy and the launch
    origin.executor.sync()
    ours = live(world)
    assert len(ours) == 3
    copy = copies.scheduler(kind, snapshot)  # its first loops run before the original's next heartbeat
    settle(1.0)
    with looping(origin):
        settle(DEAD_THERE)  # both loop: each re-checks every pod in flight labelled with the (one) deployment id
    theirs = assert_apart(world, origin, copy, ours, kind=kind)
    assert len(theirs) == 3, "the copy launched nothing: the scenario did not happen"
    if kind == "fenced":
        assert said_collision(world, copy)
        from fenced_k8s_executor import cli, config, deployment, witness

        ours_id = deployment.resolve(config.FencedConfig(), create=False)
        view = witness.observe(world.kube, world.namespace, ours_id.id, interval=0.3, alive_for=2)
        rows = cli.survey(world.kube, [world.namespace], ours_id, view=view)
        standing = {r["pod"]: (r["standing"], r["enforce would"]) for r in rows}
        assert {standing[name] for name in theirs} == {("launched by another database", "keep")}
        assert {standing[name] for name in ours} == {("current", "keep")}
        assert view.collision


@pytest.mark.tasks("t1", "t2", "t3")
@pytest.mark.parametrize("kind", KINDS)
def test_a_copy_never_touches_the_pods_of_an_original_whose_lease_writes_are_refused(
        world, copies, kind, needs_write_faults):
    """Issue 59: production's scheduler heartbeats in its own database while its Lease writes are
    refused (API Priority and Fairness answering 429 for its user, a webhook, a Role edited after
    start) from before the copy: its last post is behind the copy's row of its job. Once that post
    was old enough the copy read it as a dead scheduler of its own: its adoption relabelled the
    running pods and its clear's verdicts deleted them (4 of 4 runs; stock relabels them). A post
    behind its row by more than its posting lag is a scheduler that wrote without posting: never
    taken for dead."""
    origin = running_original(world, kind, ("t2", "t3"))
    time.sleep(1.0)  # its witness posts that heartbeat
    world.backend.add_fault(method="PATCH", path=r"/leases/", status=429, who=origin.user)
    with looping(origin):  # mute: it heartbeats on in its database, never in the Lease
        _wait_for_heartbeats_past_its_post(world, origin, 5.0, kind)
    ours = live(world)
    snapshot = copies.take()
    with looping(origin):
        copy = copies.scheduler(kind, snapshot)
        settle(DEAD_THERE)  # the original's scheduler is dead in the copy
        copy.do("adopt")
        copy.do("clear", task="t1")
        settle(2.0)
    assert_apart(world, origin, copy, ours, kind=kind, stock={"patch"})
    if kind == "fenced":
        text = (world.tmp_path / f"{copy.user}.log").read_text() + (world.tmp_path / f"{copy.user}.out").read_text()
        assert "long after its last post" in text, "the copy did not say why it leaves the original's pods alone"


@pytest.mark.tasks("t1", "t2", "t3")
def test_a_copy_stays_one_when_the_lease_is_deleted_by_hand_during_a_production_restart(world, copies):
    """Issue 59: the copy learned it was one; production's scheduler restarted and, meanwhile,
    someone deleted the witness Lease (``kubectl delete lease``). The copy made it again with its
    own entry alone and, its copy's date recomputed from that reading, took the original's running
    pods for a dead scheduler's of its own: it relabelled and deleted them. The date is kept (in
    the process and in its own database). Stock has no witness: its copy's result is the tests
    above."""
    from kubernetes.client import CoordinationV1Api

    from fenced_k8s_executor import config, deployment, witness

    origin = running_original(world, "fenced", ("t2", "t3"))
    ours = live(world)
    snapshot = copies.take()
    with looping(origin):
        copy = copies.scheduler("fenced", snapshot)
        settle(DEAD_THERE)  # the original goes on: the copy learns it is one
    assert said_collision(world, copy)
    origin.stop()  # production's scheduler restarts ...
    ours_id = deployment.resolve(config.FencedConfig(), create=False).id
    CoordinationV1Api(world.kube.api_client).delete_namespaced_lease(witness.lease_name(ours_id), world.namespace)
    settle(2.0)  # ... and the copy's witness makes the Lease again, with its own entry alone
    assert [lease for lease in world.backend.leases(world.namespace)
            if lease["metadata"]["name"] == witness.lease_name(ours_id)], "the copy did not post again"
    copy.do("adopt")
    copy.do("clear", task="t1")
    settle(2.0)
    assert not touches(world, copy.user, ours), "the copy forgot it is one and touched the original's pods"
    assert ours <= live(world)


@pytest.mark.tasks("t1", "t2", "t3", "t4")
@pytest.mark.parametrize("kind", KINDS)
def test_a_copy_given_its_own_id_as_the_runbook_says_never_touches_the_originals_pods(world, copies, kind):
    """Issue 59, the copy runbook's remedy (docs/operations.md, step 1): the copy's schedulers start
    with ``deployment_id`` set to an id of its own. Before, its adoption relabelled production's
    running pods and its stuck-in-queued revoke deleted a pending one: a pod this database launched
    is never hidden from the provider whatever its stamp, and whether this database launched it was
    judged through the copy's own, new Lease, where production never posts. Now the copy also reads
    the Lease of the id stored in its database, production's, and learns there that it is a copy.
    Stock's copy with its own id relabels and revokes as well (its listings go by labels alone)."""
    origin = running_original(world, kind)
    ours = live(world)
    snapshot = copies.take()
    with looping(origin):
        copy = copies.scheduler(kind, snapshot, AIRFLOW__FENCED_KUBERNETES_EXECUTOR__DEPLOYMENT_ID="staging-copy")
        settle(DEAD_THERE)  # the original's scheduler is dead in the copy
        copy.do("adopt")
        copy.do("stuck")
        settle(2.0)
    assert_apart(world, origin, copy, ours, kind=kind, stock={"patch", "delete"})


@pytest.mark.tasks("t1", "t2", "t3", "t4")
@pytest.mark.parametrize("kind", KINDS)
def test_a_copy_taken_in_the_middle_of_a_creation_batch_never_touches_the_originals_pods(
        world, copies, kind, needs_write_faults):
    """The copy's consistent point falls while the original creates a batch (each create held
    1.5 s by the API server): the copy holds the batch's rows QUEUED by the original's scheduler,
    which is dead there once its heartbeats stop arriving; the copy's adoption launches them under
    the same tokens (their pods exist: the original's), its stuck-in-queued handler revokes them."""
    origin = world.scheduler(kind)
    origin.heartbeat()
    world.queue(origin)
    world.backend.add_fault(method="POST", path=r"/pods$", delay=1.5, who=origin.user)
    creating = threading.Thread(target=origin.executor.sync)
    creating.start()
    time.sleep(2.0)  # one pod created, the next on its way
    snapshot = copies.take()
    creating.join(timeout=30)
    world.backend.clear_faults()
    ours = live(world)
    assert len(ours) == 4
    with looping(origin):
        copy = copies.scheduler(kind, snapshot)
        settle(DEAD_THERE)  # the original's scheduler is dead in the copy
        copy.do("adopt")
        copy.do("stuck")
        settle(2.0)
    assert_apart(world, origin, copy, ours, kind=kind, stock={"patch", "delete"})


@pytest.mark.tasks("t1", "t2", "t3", "t4")
@pytest.mark.parametrize("way", ["clear", "retry", "stuck_in_queued", "adoption"])
@pytest.mark.parametrize("kind", KINDS)
def test_a_copy_taken_while_earlier_launches_run_never_touches_their_pods_when_it_supersedes_them(
        world, copies, kind, way):
    """The original launched its tasks before the copy: t1 and t3 still Pending (QUEUED), t2 and t4
    running. In the copy they are launches of a scheduler that is dead there; the copy supersedes
    one: a user clears t1, t2 is retried (its next try queued and started there), its
    stuck-in-queued handler revokes t3 (once its adoption has made t3 the copy's), its orphan
    adoption takes t4. Before, the copy held their
    launcher's heartbeat and took them for its own: it deleted, revoked or relabelled them."""
    origin = running_original(world, kind)
    ours = live(world)
    snapshot = copies.take()
    with looping(origin):
        copy = copies.scheduler(kind, snapshot)
        settle(DEAD_THERE)  # the original's scheduler is dead in the copy
        if way == "clear":
            copy.do("clear", task="t1")
        elif way == "retry":
            copy.do("retry", task="t2")
            settle(2.0)  # the copy queues and launches t2's next try
            (next_pod,) = {p.metadata.name for p in world.live_pods(world.row("t2"))} - ours
            copy.do("run", task="t2", hostname=next_pod)  # ... whose pod (the copy's) starts: the row's host now
        elif way == "stuck_in_queued":
            copy.do("adopt")  # t3 becomes the copy's (queued by it), as the handler only revokes its own
            copy.do("stuck")
        else:
            copy.do("adopt")
        settle(2.0)
    stock = {"adoption": {"patch"}, "stuck_in_queued": {"patch", "delete"}}.get(way, set())
    assert_apart(world, origin, copy, ours, kind=kind, stock=stock)
    if kind == "fenced":
        assert said_collision(world, copy)


@pytest.mark.tasks("t1", "t2")
@pytest.mark.parametrize("kind", KINDS)
def test_a_copy_started_long_after_never_touches_the_originals_pods_though_its_job_ids_repeat_the_originals(
        world, copies, kind):
    """The copy waits while the original goes on: its scheduler restarts (new job ids, which the
    copy allocates again for its own schedulers: the same ids, other processes) and launches. The
    copy's scheduler then starts with the job id of the original's live scheduler."""
    first = world.scheduler(kind)
    first.heartbeat()
    snapshot = copies.take()
    first.stop()
    origin = world.scheduler(kind)  # the original's next scheduler: the id the copy's will get too
    world.queue(origin)
    origin.executor.sync()
    ours = live(world)
    with looping(origin):
        copy = copies.scheduler(kind, snapshot)
        assert copy.job_id == origin.job_id  # the scenario: one job id, two processes, two databases
        settle(DEAD_THERE)
        copy.do("adopt")
        settle(2.0)
    theirs = assert_apart(world, origin, copy, ours, kind=kind)
    assert theirs, "the copy launched nothing"


@pytest.mark.tasks("t1", "t2", "t3")
@pytest.mark.parametrize("kind", KINDS)
def test_a_point_in_time_restore_leaves_the_pods_launched_after_the_restore_point_alone(world, copies, kind):
    """The deployment's own database restored to a point in time: its schedulers stop, the database
    is replaced by its state at the restore point, new schedulers start on it in the same
    namespace. t1 was launched before the restore point and runs; t2 and t3 after it. The restored
    database cannot tell those pods from a copy's original's: it leaves them alone and says how to
    find them (``airflow fenced-k8s pods``) instead of guessing."""
    origin = world.scheduler(kind)
    world.queue(origin)
    origin.executor.sync()
    world.start_in_pod("t1")
    origin.heartbeat()
    restore_point = copies.take()
    with looping(origin):
        time.sleep(1.0)
    for task in ("t2", "t3"):  # cleared after the restore point and launched again
        world.airflow.clear(world.row(task))
    world.queue(origin)
    origin.executor.sync()
    ours = live(world)
    origin.stop()  # the old database's schedulers stop; the restore replaces it
    restored = copies.scheduler(kind, restore_point, hostname="scheduler-after-restore")
    settle(DEAD_THERE)
    restored.do("adopt")
    settle(2.0)
    assert_apart(world, origin, restored, ours, kind=kind, stock={"patch"})
    if kind == "fenced":
        text = (world.tmp_path / f"{restored.user}.log").read_text()
        text += (world.tmp_path / f"{restored.user}.out").read_text()
        assert "point-in-time restore" in text and "airflow fenced-k8s pods" in text


@pytest.mark.tasks("t1", "t2", "t3")
def test_the_restore_runbook_runs_a_task_once_and_leaves_no_pod_behind(world, copies, pg_server):
    """Issue 59, the runbook of docs/operations.md "Restoring to a point in time", step by step as
    on-call types it: the schedulers stop, the database is restored, ``airflow fenced-k8s
    restored`` (through the ``airflow`` entry point, against the restored database) declares the
    old database's schedulers gone, the schedulers start. t1 runs at the restore point: the
    restored deployment adopts its pod (relabels it) and never launches t1 again; t2 and t3 were
    cleared and launched again after the restore point: those pods name launches the restored rows
    do not, and are deleted. Before, the restored database judged itself a copy: t1 was reset and
    launched again beside its running pod, and the later pods were left for ever."""
    from airflow_process import airflow_env, run_airflow

    origin = world.scheduler("fenced")
    world.queue(origin)
    origin.executor.sync()
    _, running = world.start_in_pod("t1")
    origin.heartbeat()
    restore_point = copies.take()
    with looping(origin):
        time.sleep(1.0)
    for task in ("t2", "t3"):
        world.airflow.clear(world.row(task))
    world.queue(origin)
    origin.executor.sync()
    after_point = {p.metadata.name for t in ("t2", "t3") for p in world.live_pods(world.row(t))}
    assert len(after_point) == 2
    origin.stop()  # 1. every scheduler stops
    # 2. the database is restored (restore_point); 3. the old database is declared gone
    world.backend.set_tokens({"lab": "lab"})
    kubeconfig = world.backend.write_kubeconfig(str(world.tmp_path / "oncall.kubeconfig"), token="lab",
                                                namespace=world.namespace)
    done = run_airflow(["fenced-k8s", "restored"], airflow_env(
        restore_point, world.tmp_path / "oncall", AIRFLOW__KUBERNETES_EXECUTOR__IN_CLUSTER="False",
        AIRFLOW__KUBERNETES_EXECUTOR__CONFIG_FILE=kubeconfig,
        AIRFLOW__KUBERNETES_EXECUTOR__NAMESPACE=world.namespace,
        AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC=HEARTBEAT_SEC))
    assert done.returncode == 0, done.output[-3000:]
    assert f"job {origin.job_id} started" in done.stdout and "declared gone" in done.stdout
    # 4. the schedulers start
    restored = copies.scheduler("fenced", restore_point, hostname="scheduler-after-restore")
    settle(DEAD_THERE)
    restored.do("adopt")
    settle(3.0)
    by_restored = [e for e in world.audit() if e.get("who") == restored.user and e.get("resource", "pods") == "pods"]
    assert running in live(world), "the task running at the restore point lost its pod"
    assert {e["verb"] for e in by_restored if e.get("name") == running} == {"patch"}, "t1's pod was not adopted"
    assert {p.metadata.name for p in world.live_pods(world.row("t1"))} == {running}, "t1 was launched again"
    assert not after_point & live(world), "pods of launches after the restore point were left behind"
