"""``airflow fenced-k8s pods``: this deployment's worker pods by launch standing, and what enforce
mode would do to each.

The operator's view before switching audit -> enforce: the same verdicts the sweep and the loop's
reconcile apply, computed from the same reads (this deployment's id from the metadata DB, pod
metadata from the API server, the tasks' current rows). Read-only: it lists and reads, never
deletes or patches, and needs no scheduler (before the first fenced scheduler has stored the id, it
judges by the id that scheduler will store: ``deployment.preview``). Airflow imports this module on
every ``airflow`` call to build its parser, so everything heavy is imported inside the command.

Output: the table (and ``plain``) prints the deployment's line, the rows, then the summary and,
while another database posts under this id or this one is a copy, the collision line. ``json`` and
``yaml`` print on stdout only the list of rows, as they always have (a script reads valid JSON);
every other line goes to stderr, word for word, as the build's line above the table already did.
"""

from __future__ import annotations

from typing import Any, Iterable

GROUP = "fenced-k8s"
EXECUTOR_PODS = "kubernetes_executor=True"
DELETE, KEEP = "delete", "keep"
#: A pod stamped with this deployment's id whose launcher the witness places in another database.
ELSEWHERE = "launched by another database"
#: Every standing ``judge`` gives (a malformed launch's reads ``malformed: <its first bad field>``):
#: docs/operations.md names each (tests/unit/test_docs.py), the unit table reaches each (test_cli.py).
STANDINGS = ("current", "superseded", "task gone", "legacy row", "legacy (no task)", "legacy (no token)",
             "malformed", "this deployment (old stamp)", "another deployment's", ELSEWHERE)


def commands() -> list:
    """The ``fenced-k8s`` command group (its arguments and a lazily imported function)."""
    from airflow.cli.cli_config import ARG_OUTPUT, ActionCommand, Arg, GroupCommand, lazy_load_command

    namespace = Arg(("--namespace",), default=None,
                    help="List this namespace only (default: the executor's namespace, or its "
                    "multi_namespace_mode_namespace_list)")
    pods = ActionCommand(
        name="pods",
        help="List this deployment's worker pods by launch standing and what enforce mode would do to each "
             "(read-only)",
        func=lazy_load_command("fenced_k8s_executor.cli.pods_command"),
        args=(namespace, ARG_OUTPUT),
    )
    restored = ActionCommand(
        name="restored",
        help="After a point-in-time restore of this deployment's metadata DB, with every scheduler stopped: declare "
             "the schedulers of the database it replaced gone, so their pods are adopted or fenced as this "
             "database's (refused while one of them still posts)",
        func=lazy_load_command("fenced_k8s_executor.cli.restored_command"),
        args=(),
    )
    return [GroupCommand(name=GROUP, help="Inspect the fenced KubernetesExecutor's launches",
                         subcommands=(pods, restored, _version_command(ARG_OUTPUT)))]


def _version_command(output: Any) -> Any:
    """``airflow fenced-k8s version``: this build (version, commit), Airflow's and the provider's, the
    executor ``[core] executor`` names and the section's mode (``loaded.version_command``)."""
    from airflow.cli.cli_config import ActionCommand, lazy_load_command

    return ActionCommand(name="version",
                         help="Print this build (version, commit), the executor [core] executor names and the mode",
                         func=lazy_load_command("fenced_k8s_executor.loaded.version_command"), args=(output,))


def judge(ref: Any, row: Any, deployment: Any, finished: bool, launched: Any = None) -> tuple[str, str, str]:
    """(standing, what enforce would do, why) for one pod; ``row`` is its task's current row
    (None: no row), ``deployment`` a ``deployment.Deployment``, ``launched`` the witness's word on
    which database launched it (``lineage.Provenance``)."""
    from fenced_k8s_executor import verdicts
    from fenced_k8s_executor.lineage import Provenance
    from fenced_k8s_executor.metrics import short

    launch = ref.launch
    launched = launched or Provenance.UNSETTLED
    if launch is not None and launch.malformed:
        return f"malformed: {launch.malformed}", KEEP, "its launch identity does not read: never fenced"
    if launch is None or launch.legacy:
        return "legacy (no token)", KEEP, "no launch token (stock, or before the switch): never fenced"
    if launch.deployment != deployment.id:
        if launch.deployment and launch.deployment == deployment.address_id:
            return "this deployment (old stamp)", KEEP, "the id builds before 0.2.0 derived from the DB address: left alone"
        return "another deployment's", KEEP, f"stamped {launch.deployment or 'with no deployment'}: never touched"
    if launched is Provenance.ELSEWHERE:
        return (ELSEWHERE, KEEP, "stamped with this deployment's id, but its launcher is not a "
                "scheduler of this database (or one it inherited from its original): never deleted or adopted")
    standing = verdicts.standing(launch, row)
    verdict = verdicts.should_delete(launch, row, deployment.id, ref.name, launched)
    name = {verdicts.Standing.TASK_GONE: "task gone", verdicts.Standing.LEGACY_LAUNCH: "legacy (no task)",
            verdicts.Standing.LEGACY_ROW: "legacy row"}.get(standing, standing.value)
    if ref.deleting:
        return name, KEEP, "already being deleted"
    if finished:
        return name, KEEP, "finished: delete_worker_pods decides, as for stock"
    if verdict.act:
        why = ("the task has no row (run or DAG deleted)" if standing is verdicts.Standing.TASK_GONE
               else f"the task's row names launch {short(row.token)} now")
        return name, DELETE, why
    if verdict.reason is verdicts.Reason.FOREIGN:
        return name, KEEP, ("the witness cannot tell yet whether this database launched it (another database "
                            "posts under this id, or a scheduler has not been seen writing here): not deleted now")
    return name, KEEP, {verdicts.Standing.CURRENT: "the task's row names this launch",
                        verdicts.Standing.LEGACY_ROW: "the task's row has no token: no evidence",
                        verdicts.Standing.LEGACY_LAUNCH: "the pod names no task"}.get(
        standing, "the task's row names this pod as its host: left to finish"
        if verdict.reason is verdicts.Reason.RUNS_THE_TASK else verdict.reason.value)


def survey(kube_client: Any, namespaces: Iterable[str | None], deployment: Any, *, request_args: dict | None = None,
           page_size: int = 500, view: Any = None) -> list[dict]:
    """One row per executor pod in ``namespaces``: metadata-only lists (all pods, then the
    unfinished ones, which tells the finished apart), one DB read per page of this deployment's
    pods and of their launchers' job rows, judged with the witness's ``view`` (``witness.observe``;
    None: nothing in doubt is judged this database's)."""
    from fenced_k8s_executor import ledger, lineage, pods, sweep, witness
    from fenced_k8s_executor.metrics import short

    view = view if view is not None else lineage.View()
    judged = []
    for namespace in namespaces:
        unfinished = {(ref.namespace, ref.name) for page in pods.list_pages(
            kube_client, namespace, label_selector=EXECUTOR_PODS, field_selector=sweep.SWEEP_FIELD_SELECTOR,
            page_size=page_size, request_args=request_args) for ref in page}
        for page in pods.list_pages(kube_client, namespace, label_selector=EXECUTOR_PODS, page_size=page_size,
                                    request_args=request_args):
            ours = [ref for ref in page if ref.launch is not None and ref.launch.task
                    and ref.launch.deployment == deployment.id]
            rows = ledger.read_rows(ref.launch.task for ref in ours) if ours else {}
            jobs = witness.read_jobs({ref.launch.launcher.job_id for ref in ours if ref.launch.launcher})
            for ref in page:
                launch = ref.launch
                task = launch.task if launch is not None else None
                launcher = launch.launcher if launch is not None else None
                launched = lineage.provenance(launcher, jobs.get(launcher.job_id) if launcher else None, view)
                judged.append((ref, rows.get(task) if task else None, launched,
                               (ref.namespace, ref.name) not in unfinished))
    out = []
    for ref, row, launched, finished in judged:
        launch = ref.launch
        task = launch.task if launch is not None else None
        standing, action, why = judge(ref, row, deployment, finished, launched)
        out.append({"namespace": ref.namespace, "pod": ref.name,
                    "task": f"{task[0]}.{task[1]} {task[2]}" + (f" [{task[3]}]" if task[3] >= 0 else "")
                    if task else "-",
                    "try": launch.try_number if launch is not None else "-",
                    "launch": short(launch.token) if launch is not None and launch.token else "-",
                    "standing": standing, "enforce would": action, "why": why})
    return sorted(out, key=lambda r: (r["enforce would"] != DELETE, r["standing"], r["namespace"], r["pod"]))


def failure(error: BaseException) -> str:
    """The one line ``airflow fenced-k8s pods`` answers a failure with: what could not be reached or
    read, and the error's own first line (never a traceback: the operator runs this by hand, often
    in a container that is only half configured)."""
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config.config_exception import ConfigException
    from sqlalchemy.exc import SQLAlchemyError
    from urllib3.exceptions import HTTPError, MaxRetryError

    from fenced_k8s_executor.config import FencedConfigError
    from fenced_k8s_executor.deployment import NotStored

    def first_line(what: object) -> str:
        text = str(what).strip()
        line = text.splitlines()[0].strip() if text else type(what).__name__
        return line if len(line) <= 300 else line[:297] + "..."

    if isinstance(error, FencedConfigError):
        return str(error)  # one line, naming every option and name it refuses
    if isinstance(error, ConfigException):
        return (f"no Kubernetes client configuration ({first_line(error)}): set [kubernetes_executor] config_file "
                "and in_cluster = False, or run it in a pod whose service account may list pods")
    if isinstance(error, ApiException):
        return f"the Kubernetes API server answered {error.status} {error.reason}"
    if isinstance(error, MaxRetryError):
        pool = getattr(error, "pool", None)
        where = f" at {pool.scheme}://{pool.host}:{pool.port}" if pool is not None else ""
        reason = first_line(error.reason).rpartition(">: ")[2]  # urllib3 1.x opens with the connection's repr
        return f"the Kubernetes API server{where} did not answer: {reason}"
    if isinstance(error, HTTPError):
        return f"the Kubernetes API server did not answer: {first_line(error)}"
    if isinstance(error, NotStored):  # `pods` answers without one (deployment.preview); other commands may not
        return f"{first_line(error)}: start a fenced scheduler first (nothing is deleted before one runs)"
    if isinstance(error, SQLAlchemyError):
        return f"the metadata database could not be read: {first_line(getattr(error, 'orig', None) or error)}"
    return f"{type(error).__name__}: {first_line(error)}"


def pods_command(args: Any) -> None:
    """Any failure answers in one line on stderr and exit code 1 (``failure``). The kubernetes
    client's retry warnings (ten against an API server that does not answer) are held back while
    it runs: the answer names the cause once."""
    import logging

    retries = logging.getLogger("urllib3.connectionpool")
    level = retries.level
    retries.setLevel(logging.ERROR)
    try:
        _pods(args)
    except Exception as error:
        raise SystemExit(f"airflow {GROUP} pods: {failure(error)}") from None
    finally:
        retries.setLevel(level)


def _pods(args: Any) -> None:
    import sys

    from airflow.cli.simple_table import AirflowConsole
    from airflow.configuration import conf
    from airflow.providers.cncf.kubernetes.kube_client import get_kube_client
    from airflow.providers.cncf.kubernetes.kube_config import KubeConfig

    from fenced_k8s_executor import config, deployment, lineage, loaded, pods, witness

    fence = config.load(conf)
    loaded.cli_header(conf, args.output)  # this build, and the executor [core] executor names (issue 54)
    found = deployment.preview(fence)  # read-only: a scheduler stores the id
    kube_config = KubeConfig()
    if args.namespace:
        namespaces: list[str | None] = [args.namespace]
    elif kube_config.multi_namespace_mode:
        namespaces = list(kube_config.multi_namespace_mode_namespace_list or [None])
    else:
        namespaces = [kube_config.kube_namespace]
    kube = get_kube_client()
    args_ = pods.request_args(kube_config.kube_client_request_args)
    lease = f"{kube_config.kube_namespace}/{witness.lease_name(found.id)}"
    if found.id == deployment.NO_ID_YET:
        view = lineage.View(renewed=True)  # no id, no Lease: no pod is this deployment's yet
    else:
        view = witness.observe(kube, kube_config.kube_namespace, found.id, request_args=args_,
                               interval=conf.getfloat("scheduler", "scheduler_heartbeat_sec", fallback=5.0),
                               alive_for=conf.getfloat("scheduler", "scheduler_health_check_threshold", fallback=30.0),
                               also=tuple(filter(None, [found.stored])))
    rows = survey(kube, namespaces, found, request_args=args_, view=view)
    facts = sys.stdout if args.output in ("table", "plain") else sys.stderr  # json/yaml: stdout is the rows
    where = ", ".join(n or "all namespaces" for n in namespaces)
    print(f"{deployment_line(found)}, mode {fence.mode.value}, {where}", file=facts)
    facts.flush()
    AirflowConsole().print_as(data=rows, output=args.output)
    sys.stdout.flush()
    for line in summary(rows, view, found.id, lease, fence):
        print(line, file=facts)


def deployment_line(found: Any) -> str:
    """Which deployment the rows are judged for, and whether its id is stored yet."""
    from fenced_k8s_executor.deployment import NO_ID_YET, NOT_STORED

    if found.source != NOT_STORED:
        return f"deployment {found.id} ({found.source})"
    if found.id == NO_ID_YET:
        return ("deployment id not stored yet: no fenced scheduler has run on this database, which does not say "
                "who it is, so the first one stores a random id, which no pod carries yet")
    return (f"deployment {found.id} (not stored yet: no fenced scheduler has run on this database; the first one "
            f"stores this id, derived from the database's identity as builds 0.2.x stamped it)")


def summary(rows: list[dict], view: Any, deployment_id: str, lease: str, fence: Any) -> list[str]:
    """The lines after the rows: the counts, the collision line while another database posts under
    this id or this database is a copy (``view``, ``witness.observe``), and the pods another
    database launched."""
    from fenced_k8s_executor import witness

    deleting = [r for r in rows if r["enforce would"] == DELETE]
    lines = [f"{len(rows)} pods; enforce would delete {len(deleting)} and keep {len(rows) - len(deleting)}"
             + ("" if fence.enforcing or not deleting else f" (mode {fence.mode.value}: nothing is deleted now)")]
    if view.collision or view.copied_at is not None:
        lines.append("COLLISION: " + witness.collision_line(view, deployment_id, lease, None))
    copies = [r for r in rows if r["standing"] == ELSEWHERE]
    if copies:
        lines.append(f"{len(copies)} pods stamped with this deployment's id were launched by another database: "
                     "never deleted or adopted here")
    return lines


def restored_command(args: Any) -> None:
    """``airflow fenced-k8s restored`` (``witness.declare_restored``): one line per outcome; exit 1,
    naming them, while a scheduler the restored database inherited still posts."""
    from airflow.configuration import conf
    from airflow.providers.cncf.kubernetes.kube_client import get_kube_client
    from airflow.providers.cncf.kubernetes.kube_config import KubeConfig

    from fenced_k8s_executor import config, deployment, pods, witness

    try:
        found = deployment.resolve(config.load(conf), create=False)
        kube_config = KubeConfig()
        gone = witness.declare_restored(
            get_kube_client(), kube_config.kube_namespace, found.id,
            interval=conf.getfloat("scheduler", "scheduler_heartbeat_sec", fallback=5.0),
            request_args=pods.request_args(kube_config.kube_client_request_args))
    except witness.StillPosting as error:
        raise SystemExit(f"airflow {GROUP} restored: {error}") from None
    except Exception as error:
        raise SystemExit(f"airflow {GROUP} restored: {failure(error)}") from None
    named = ", ".join(f"job {e.job_id} started {e.started.isoformat(timespec='seconds')} on {e.host}" for e in gone)
    print(f"deployment {found.id}: declared gone {named or 'no scheduler (none posted ahead of this database)'}; "
          f"this database's copy date is cleared. Start the schedulers: their adoption takes these schedulers' "
          f"running pods, and pods of launches after the restore point are deleted as superseded.")

