"""The safety mutants: each fence fix since issue 11 taken back as the smallest code change that
brings its defect back, and mutants chosen in the fences' own modules. Each is a list of exact
(file, old, new) edits, checked to apply exactly once (``Mutant.apply``), so an edit of the code
under it shows up as "no longer applies", never as a silently different mutant.

``named`` are the tests that must kill it (pytest node ids without parameters: the runner keeps the
fenced executor's cases on the emulator); ``promise`` is the checker promise the defect breaks, or
None where no promise of the checker can see it (said in ``note``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

I = "tests/integration/"
U = "tests/unit/"
REGRESSIONS = I + "test_interleaving_regressions.py::"
EDGES = "tests/mutation/test_core_edges.py"


class NoLongerApplies(Exception):
    """The code a mutant edits has changed: the mutant must be written again against it."""


@dataclass(frozen=True)
class Mutant:
    name: str
    origin: str  # the fix's commit (and issue) it takes back, or "chosen"
    defect: str  # what the mutant brings back, in one line
    edits: tuple  # ((file, old, new), ...)
    named: tuple  # tests that must kill it
    promise: str | None = None  # the checker promise its defect breaks
    note: str = ""
    fast: bool = False  # in CI's fast subset (tests/mutation/test_mutants.py)
    tags: tuple = field(default=())

    @property
    def fix(self) -> bool:
        return not self.origin.startswith("chosen")

    def apply(self, root: Path) -> None:
        """Edit the tree at ``root`` (a scratch copy); raises NoLongerApplies naming the edit."""
        for path, old, new in self.edits:
            file = root / path
            text = file.read_text() if file.exists() else ""
            count = text.count(old)
            if count != 1:
                raise NoLongerApplies(f"{self.name}: {path} holds the snippet {count} times (needs exactly 1): "
                                      f"{old.strip().splitlines()[0][:90]!r}")
            file.write_text(text.replace(old, new, 1))


def m(name, origin, defect, edits, named, promise=None, note="", fast=False):
    return Mutant(name, origin, defect, tuple(edits), tuple(named), promise, note, fast)


V, LA = "fenced_k8s_executor/verdicts.py", "fenced_k8s_executor/launch.py"
IF, DEP = "fenced_k8s_executor/in_flight.py", "fenced_k8s_executor/deployment.py"
FI, FE = "fenced_k8s_executor/fences/inflight.py", "fenced_k8s_executor/fences/events.py"
FC, FH = "fenced_k8s_executor/fences/creation.py", "fenced_k8s_executor/fences/handover.py"
EX, W = "fenced_k8s_executor/executor.py", "fenced_k8s_executor/watching.py"
LN = "fenced_k8s_executor/lineage.py"

MUTANTS: tuple[Mutant, ...] = (
    # ---------------------------------------------------------------- fixes taken back
    m("swallowed_event_keeps_slot", "0a75416 (issue 11 item 1)",
      "a stale launch's swallowed event no longer frees its executor slot",
      [(FE, "            self._retire_finished_pod(results.pod_name, results.namespace, launch, results.state)\n"
            "        self._release(results.key, launch)\n",
            "            self._retire_finished_pod(results.pod_name, results.namespace, launch, results.state)\n"),
      ],
      [I + "test_launch_standing.py::test_ordinary_retry_releases_the_slot",
       I + "test_launch_standing.py::test_clear_of_a_queued_ti_releases_the_slot",
       I + "test_launch_standing.py::test_requeue_by_the_peer_releases_the_slot"],
      "slot_held",
      note="equivalent today: since e26b1bf a stale pod that finishes leaves the in-flight watch, which frees its slot too, and "
           "the reconcile frees the slot of each pod it deletes: the event path alone is no longer the only one"),
    m("standing_by_row_id", "0a75416 (issue 11 item 2)",
      "a row with the launch's token under a new id (a clear, a retry) is taken for another launch",
      [(V, "    return Standing.CURRENT if row.token == as_token(launch.token) else Standing.SUPERSEDED\n",
           "    if row.ti_id != launch.ti_id:\n        return Standing.SUPERSEDED\n"
           "    return Standing.CURRENT if row.token == as_token(launch.token) else Standing.SUPERSEDED\n")],
      [I + "test_launch_standing.py::test_clear_running_task_pod_end_sends_restarting_ti_back_to_scheduling"],
      "not_terminal"),
    m("queued_event_carries_the_token", "0a75416 (issue 11 item 3, b5)",
      "the QUEUED event's token info stays in the event buffer: a late one writes an old token over a newer launch's",
      [(EX, "                # token (b5). The scheduler's own pre-assigned value is the token.\n"
            "                self.event_buffer.pop(key, None)\n",
            "                # token (b5). The scheduler's own pre-assigned value is the token.\n"
            "                pass\n")],
      [I + "test_precreate_races.py::test_b5_queued_event_never_overwrites_the_token",
       I + "test_launch_standing.py::test_late_queued_event_does_not_fence_the_live_launch"],
      "current_pod_deleted"),
    m("deletes_pods_of_other_deployments", "0a75416 (issue 11 item 4)",
      "a stale-looking pod is deleted whichever deployment launched it",
      [(V, "    return bool(launch is not None and deployment and launch.deployment == deployment\n"
           "                and launched is Provenance.HERE)\n", "    return launch is not None\n"),
       (IF, '    return f"kubernetes_executor=True,{TOKEN_LABEL},{DEPLOYMENT_LABEL}={deployment}"\n',
            '    return f"kubernetes_executor=True,{TOKEN_LABEL}"\n')],
      [I + "test_deployments.py::test_other_deployments_pod_in_a_shared_namespace_is_never_deleted",
       I + "test_deployments.py::test_multi_namespace_sweep_never_deletes_other_deployments_pods"],
      "bystander_deleted",
      note="the ownership check (the stamp and the witness's word on the launcher, verdicts.owned, which the pod "
           "re-read before a delete asks too) and the in-flight watch's label selector: taken out of both"),
    m("finished_stale_pod_always_deleted", "0a75416 (issue 11 item 5)",
      "a superseded launch's finished pod is deleted whatever delete_worker_pods says",
      [(EX, "        if self.kube_config.delete_worker_pods:\n            if state != FAILED",
            "        if True:\n            if state != FAILED")],
      [I + "test_launch_standing.py::test_stale_finished_pod_follows_delete_worker_pods"],
      None, note="the checker does not judge finished pods (delete_worker_pods is off in its worlds)"),
    m("host_pod_cut_off", "ef10cc9 (issue 35, the row's-host rule; issue 11 item 5)",
      "the pod the task's row names as its host (it ran the task, finishing) is deleted once superseded",
      [(V, "    if names_host(row, pod):\n        return _HOST\n", "")],
      [I + "test_fence_by_launch.py::test_the_pod_the_task_last_ran_on_is_left_to_finish_until_the_next_try_starts"],
      "host_pod_deleted"),
    m("no_in_flight_reconcile", "47c0c75, 0d1f499 (issue 12 item 1, issue 28)",
      "launches in flight are read every loop but no superseded one is deleted",
      [(FI, "        for flying, row in loop.changed:\n            self._fence_in_flight(flying, row)\n",
            "        for flying, row in []:\n            self._fence_in_flight(flying, row)\n")],
      [I + "test_inflight_reconcile.py::test_pending_pod_superseded_by_a_rest_clear_dies_within_one_loop",
       I + "test_inflight_reconcile.py::test_pending_pod_superseded_by_the_peer_scheduler_dies_within_one_loop"],
      "superseded_pending_lingers", fast=True),
    m("adoption_resets_queued_tasks", "5e223eb (issue 14 item 1)",
      "a dead scheduler's queued task with no pod is reset by adoption (a try burned) instead of launched",
      [(FH, "        return [ti for ti in to_reset if not self._adopt_by_launching(ti)]\n",
            "        return to_reset\n")],
      [I + "test_ha_adoption.py::test_dead_schedulers_queued_unlaunched_tasks_burn_no_try"],
      None, note="the checker allows the try an orphan reset spends (stock spends it too)"),
    m("failed_delete_settles", "9c4ada6 (issue 14)",
      "a reconcile delete that met an API error is taken as done: the pod is never offered again",
      [(FI, "        if deleted is None:\n            return  # API error: no evidence the pod is gone, re-check next loop\n",
            "")],
      [REGRESSIONS + "test_a_delete_that_met_an_api_error_is_sent_again_next_loop"],
      "superseded_pending_lingers",
      note="survived its first named tests (a peer always took over); the regression test was added for it"),
    m("transient_create_error_fails_the_task", "1c6caca (issue 14 item 5)",
      "a 5xx on a pod create spends the publish retries (none by default) and fails the task",
      [(FC, "        if guards.transient(e) and self._fencing and self._has_token(task):\n",
            "        if False and guards.transient(e) and self._fencing and self._has_token(task):\n")],
      [I + "test_api_faults.py::test_create_faults_do_not_fail_the_task_with_default_publish_retries"],
      "try_burned"),
    m("adopted_pod_of_unknown_phase_not_in_flight", "5412e5b (issue 28)",
      "a pod adopted without a phase (the provider lists metadata only) is never re-checked as in flight",
      [(FH, "                if getattr(getattr(pod, \"status\", None), \"phase\", None) in (None, \"Pending\"):\n",
            "                if getattr(getattr(pod, \"status\", None), \"phase\", None) == \"Pending\":\n")],
      [I + "test_restart_handover.py::test_a_pending_pod_adopted_from_a_stopped_scheduler_then_superseded_frees_the_adopters_slot"],
      "slot_held",
      note="equivalent today: the deployment-wide watch (47c0c75, ef10cc9) re-checks the adopted pod, and the "
           "reconcile frees the adopter's slot through the book's holder"),
    m("map_index_read_loosely", "1e7a066 (review finding)",
      "a map_index annotation that does not read exactly ('1e3', '3x') is read as -1: the pod names an unmapped task",
      [(LA, "    return _number(value, 2**31)\n\n\ndef _id_text",
            "    return -1 if _number(value, 2**31) is None else _number(value, 2**31)\n\n\ndef _id_text")],
      [U + "test_launch.py", I + "test_fence_by_launch.py::test_one_malformed_pod_costs_that_pod_alone"],
      "bystander_deleted"),
    m("running_pods_not_watched", "ef10cc9 (issue 35 items 2 and 7)",
      "the in-flight watch selects Pending pods only: a Running pod of a superseded launch drops out",
      [(IF, 'FIELD_SELECTOR = "status.phase!=Succeeded,status.phase!=Failed"\n',
            'FIELD_SELECTOR = "status.phase=Pending"\n')],
      [I + "test_fence_by_launch.py::test_a_superseded_launch_whose_pod_started_dies_within_one_loop"],
      "superseded_running_lingers", fast=True),
    m("only_own_pods_rechecked", "ef10cc9 (issue 35 items 1 and 3; 47c0c75)",
      "a scheduler re-checks only the pods it created: a cut-off or dead peer's superseded pods live on",
      [(FI, "view.unsettled() if view is not None else ())",
            "[r for r in view.unsettled() if r.launch.scheduler_job_id == str(self.scheduler_job_id)]"
            " if view is not None else ())")],
      [I + "test_fence_by_launch.py::test_a_live_peer_whose_api_calls_fail_leaves_no_superseded_pod_alive",
       I + "test_restart_handover.py::test_pending_pod_of_a_killed_scheduler_dies_within_one_loop_of_its_peer"],
      "superseded_pending_lingers"),
    m("malformed_pod_offered", "ef10cc9 (issue 35 item 5)",
      "a pod whose launch names no readable task is offered to the loop's statement",
      [(IF, "                    and ref.launch.task is not None]\n", "]\n")],
      [I + "test_fence_by_launch.py::test_one_malformed_pod_costs_that_pod_alone"],
      "superseded_pending_lingers",
      note="equivalent today: the loop's probe (ledger.probe) leaves out launches that name no task"),
    m("terminating_pod_taken_for_the_launch", "ef10cc9 (issue 35, look-into item)",
      "a terminating pod under the launch's name answers the create's 409 as if it were the launch's pod",
      [(FC, "        if ref is None or ref.deleting:  # unreadable", "        if ref is None:  # unreadable")],
      [I + "test_fence_by_launch.py::test_a_terminating_pod_under_the_launch_name_is_never_taken_for_the_launch_pod"],
      "not_terminal"),
    m("adopt_later_never_launches", "ef10cc9 (issue 35, look-into item)",
      "tasks adopted while the dead scheduler's pods could not be listed are never launched once they can",
      [("fenced_k8s_executor/guards.py",
        "                    launched += bool(self._adopt_by_launching(ti))\n",
        "                    launched += 0\n")],
      [I + "test_fence_by_launch.py::test_a_queued_task_adopted_while_pods_could_not_be_listed_is_launched_once_they_can"],
      "try_burned"),
    m("empty_watch_spins", "ef10cc9 (issue 35, look-into item)",
      "a watch a proxy ends at once with nothing in it is renewed at once, forever",
      [(IF, "                if not events and time.monotonic() - started < SHORT_WATCH:\n",
            "                if False:\n")],
      [I + "test_in_flight_watch.py::test_a_watch_that_ends_at_once_is_retried_with_back_off_not_spun"],
      None, note="the emulator's watches do not end empty at once"),
    m("id_derived_from_the_system_identifier", "issue 45 item 1 (this change)",
      "the deployment id is derived from the DB's system identifier again: pg_upgrade and dump/restore change it",
      [(DEP, "        return Deployment(_read_or_store(engine, schema, create), STORED, old)\n",
             "        return Deployment(_seed(engine, schema), STORED, old)\n")],
      [I + "test_identity_contract.py::test_the_id_survives_pg_upgrade",
       I + "test_identity_contract.py::test_the_id_survives_a_dump_and_restore"],
      None, note="the checker's database is never upgraded or restored"),
    m("adoption_hides_an_old_stamp", "issue 45 item 1",
      "the provider's adoption hides every pod stamped with another id: a deployment whose id changed loses its running tasks",
      [(V, "    if launch is None or (launched is Provenance.HERE and launch.launcher is not None):\n",
           "    if launch is None:\n")],
      [I + "test_clone_deployments.py::test_a_running_task_survives_a_scheduler_restart_under_a_new_id"],
      "adopted_task_reset", note="the checker's new_generation step changes the id"),
    m("witness_not_consulted", "issue 52 item 2 (this change)",
      "a pod stamped with this deployment's id is deleted whichever database launched it: a copy deletes the original's pods",
      [(V, "    return bool(launch is not None and deployment and launch.deployment == deployment\n"
           "                and launched is Provenance.HERE)\n",
           "    return bool(launch is not None and deployment and launch.deployment == deployment)\n")],
      [I + "test_copies.py::test_a_copy_taken_between_two_heartbeats_never_touches_the_originals_pods",
       I + "test_witness.py::test_a_pod_with_launcher_stamps_of_no_scheduler_here_costs_that_pod_alone",
       U + "test_provenance.py"],
      "current_pod_deleted", note="the checker's clone_appears step starts a copy's scheduler in the namespace"),
    m("rows_decide_who_launched", "issue 52 item 1 (this change)",
      "a scheduler job this database holds launched the pod, whatever the witness says: what a database says about "
      "itself decides again, and a copy holds the original's jobs",
      [(LN, "    if launcher.job_id in view.here:\n        return Provenance.HERE\n", "    return Provenance.HERE\n")],
      [I + "test_copies.py::test_a_copy_taken_between_two_heartbeats_never_touches_the_originals_pods",
       I + "test_copies.py::test_a_point_in_time_restore_leaves_the_pods_launched_after_the_restore_point_alone",
       U + "test_provenance.py"],
      "current_pod_deleted", note="the checker's clone_appears step, whose copy is taken at a drawn instant"),
    m("unproven_taken_for_dead", "issue 52 item 2 (this change)",
      "a live scheduler the witness has not seen writing here is taken for a dead one of this database: a copy "
      "taken between two heartbeats deletes the original's pods until its next heartbeat",
      [(LN, "        elif alive:\n            unproven.append(entry)\n", "")],
      [I + "test_copies.py::test_a_copy_taken_between_two_heartbeats_never_touches_the_originals_pods",
       U + "test_provenance.py"],
      "current_pod_deleted", note="clone_appears with the copy taken right after a heartbeat, before a launch"),
    m("mute_taken_for_dead", "issue 59 item 1",
      "a scheduler that wrote to this database's line without posting (its Lease writes refused) is taken for a "
      "dead one of this database once its last post is old: a copy deletes and relabels the mute original's pods",
      [(LN, "            mute.append(entry)\n", "            pass\n")],
      [I + "test_copies.py::test_a_copy_never_touches_the_pods_of_an_original_whose_lease_writes_are_refused",
       U + "test_provenance.py::test_a_scheduler_that_writes_here_without_posting_is_never_taken_for_dead"],
      "current_pod_deleted", note="not drawn by the checker yet (no mute step)"),
    m("copy_not_dated", "issue 52 item 2 (this change)",
      "a scheduler the copy inherited that went on writing elsewhere leaves no mark: once it stops, its pods are "
      "the copy's dead scheduler's, deleted when the copy supersedes them (a point-in-time restore's leftovers too)",
      [(LN, "            copied.append(max(t for t in (row.heartbeat, row.started, entry.started) if t is not None))\n",
        "            pass\n")],
      [I + "test_copies.py::test_a_point_in_time_restore_leaves_the_pods_launched_after_the_restore_point_alone",
       U + "test_provenance.py"],
      None, note="the checker's original never stops while its clone runs"),
    m("launcher_start_not_compared", "issue 52 item 2 (this change)",
      "a pod's launcher is judged by its job id alone: copies of a database allocate the same ids, so each takes "
      "the other's pods for its own",
      [(LN, "    if launcher.started is None or row is None or row.started != launcher.started:\n",
        "    if launcher.started is None or row is None:\n")],
      [I + "test_copies.py::test_a_copy_started_long_after_never_touches_the_originals_pods_though_its_job_ids_repeat_the_originals",
       U + "test_provenance.py"],
      None, note="the checker's clone and original rarely share a job id"),
    m("host_by_name_only", "issue 45 item 6 (this change)",
      "a row naming its host by IP (hostname_callable = get_host_ip_address) is not read: a finishing try is deleted",
      [(FI, "            addresses = self._addresses_of(f)\n", "            addresses = ()\n")],
      [I + "test_clone_deployments.py::test_the_pod_the_task_last_ran_on_is_left_to_finish_when_the_row_names_its_ip"],
      None, note="the checker's rows name pods by name"),
    m("identity_refusal_retried", "issue 45 item 5 (this change)",
      "an identity query refused with SQLSTATE 0A000 is retried for ever: pods go out unstamped, the fences are off",
      [(DEP, "        if sqlstate.transient(error):\n            raise\n        raise Unreadable(",
             "        if True:\n            raise\n        raise Unreadable(")],
      [I + "test_identity_contract.py::test_a_database_that_will_not_say_who_it_is_gets_a_random_id"],
      None, note="the checker's database always says who it is"),
    m("fence_connection_unbounded", "issue 45 item 3 (this change)",
      "the fences' connections carry no TCP bound: a flow a NAT forgot holds the loop for Linux's 15 minutes",
      [("fenced_k8s_executor/db.py", "    if dialect.name != \"postgresql\" or dialect.driver not in LIBPQ_DRIVERS:\n        return {}\n",
        "    if True:\n        return {}\n")],
      [I + "test_db_bounds.py::test_fence_connections_carry_the_tcp_bounds_and_airflows_keep_theirs"],
      None, note="since issue 52 the watchdog bounds a statement sent into a dead flow (db.bounds().operation), so "
                 "the checker's black_holed_loop step no longer sees a blocked loop; the TCP bounds keep a NAT's "
                 "flow alive and find a dead idle one"),
    m("fence_operation_unwatched", "issue 52 item 5 (this change)",
      "no wall-clock bound on a fence statement: behind a pooler whose server went silent, or a black hole in the "
      "middle of a statement, the loop waits forever (or for the keepalives' 40 s)",
      [("fenced_k8s_executor/watchdog.py", "    watch = Watch(connection, fd, time.monotonic() + max(0.0, seconds), what)\n",
        "    watch = Watch(connection, fd, time.monotonic() + 86400.0, what)\n")],
      [I + "test_db_pooler_bounds.py", I + "test_db_bounds.py::test_a_black_hole_in_the_middle_of_a_statement_is_cut_"
       "within_its_bound", U + "test_db_watchdog.py"],
      None, note="the checker has no pooler and no mid-statement black hole; its black_holed_loop step is bounded "
                 "by tcp_user_timeout without the watchdog (root only: pgbouncer and the NAT hop)"),
    m("nul_in_a_task_key_offered", "issue 45 item 4 (this change)",
      "a task key holding a NUL is put to the loop's statement, which PostgreSQL refuses for every pod",
      [(LA, '    if not isinstance(value, str) or not 0 < len(value) <= ID_LEN or "\\x00" in value:\n',
            '    if not isinstance(value, str) or not 0 < len(value) <= ID_LEN:\n')],
      [I + "test_hostile_annotations.py", U + "test_launch.py"],
      "superseded_pending_lingers", note="the checker's hostile_pod step offers a NUL in a task key"),
    m("provider_lists_foreign_pods", "443a60e (issue 36 finding)",
      "the provider's revoke and adoption listings see another deployment's pods of the same coordinates",
      [(V, "    return bool(launch is not None and launch.deployment and ours and launch.deployment not in ours)\n",
           "    return False\n")],
      [REGRESSIONS + "test_stuck_in_queued_revoke_never_deletes_another_deployments_pod"],
      "bystander_deleted", fast=True),
    m("refused_delete_settles", "6a6c23c (issue 36 finding)",
      "a reconcile delete answered 404 or 409 settles the pod though the watch still lists it",
      [(FI, "                # delete answered by a webhook or a proxy, is offered again next loop.\n"
            "                return\n",
            "                # delete answered by a webhook or a proxy, is offered again next loop.\n"
            "                pass\n")],
      [REGRESSIONS + "test_pending_pod_forgotten_after_its_delete_answered_404"],
      "superseded_pending_lingers"),
    m("deleted_pending_pod_keeps_its_slot", "e26b1bf (issue 35, lab api_cut_off)",
      "a superseded launch whose Pending pod a peer deleted keeps its creator's slot",
      [(FI, "if (key := self.book.key_held_by(ref.launch)) is not None and key in self.running]\n",
            "if (key := self.book.key_held_by(ref.launch)) is not None and key in self.running and False]\n")],
      [I + "test_fence_by_launch.py::test_a_live_peer_whose_api_calls_fail_leaves_no_superseded_pod_alive"],
      "slot_held"),
    m("watchers_back_off_to_15s", "f07ac27 (issue 36 finding)",
      "after an API outage the watchers wait up to 15 s between attempts: a finished task's slot is held",
      [(W, "BACKOFF_MAX = 2.0\n", "BACKOFF_MAX = 15.0\n"),
       (IF, "BACKOFF_START, BACKOFF_MAX = 0.5, 2.0\n", "BACKOFF_START, BACKOFF_MAX = 0.5, 15.0\n")],
      [REGRESSIONS + "test_a_slot_is_freed_soon_after_an_api_outage_ends"],
      "slot_held"),
    m("psycopg3_binds_on_the_server", "d63c12c (chart smoke finding)",
      "on psycopg 3 the loop's statement (planner settings + query in one string) is refused every loop",
      [("fenced_k8s_executor/ledger.py", "        return psycopg.ClientCursor(dbapi)\n",
        "        return dbapi.cursor()\n")],
      [I + "test_ledger.py::test_the_loop_read_returns_only_the_launches_whose_row_changed"],
      "superseded_pending_lingers", note="seen only on worlds that run psycopg 3"),
    m("watcher_ignores_sigterm", "e2b07ce (issue 28)",
      "the watcher process ignores SIGTERM: a stopping scheduler waits 20 s per watcher, its Job still running",
      [(W, "        signal.signal(signal.SIGTERM, signal.SIG_DFL)\n        super().run()\n",
           "        super().run()\n")],
      [I + "test_restart_handover.py::test_a_watcher_ends_on_sigterm_so_a_stopping_scheduler_hands_over_at_once"],
      None, note="a slow stop breaks no promise of the checker (it judges by loops, not seconds)"),
    # ---------------------------------------------------------------- chosen
    m("precreate_ignores_the_token", "chosen",
      "the pre-creation check is stock's alone: a superseded launch of the same id and try gets a pod (a1)",
      [(V, "    if s is Standing.SUPERSEDED:\n        return Verdict(False, stock, Reason.SUPERSEDED)\n", "")],
      [I + "test_precreate_races.py::test_a1_same_id_and_try_queued_twice_creates_one_pod",
       REGRESSIONS + "test_a_superseded_launch_never_gets_a_pod"],
      None,
      note="the checker does not judge creates (the check-then-create gap a2 is the reconcile's); survived test_a1 (it counts the pods left; the reconcile deletes the extra one next loop): "
           "test_a_superseded_launch_never_gets_a_pod counts the creates"),
    m("creation_acts_on_the_stock_verdict", "chosen",
      "the creation fence creates whenever stock would (the verdict's act ignored)",
      [(FC, "        create = verdict.act if self._enforcing else verdict.stock\n",
            "        create = verdict.stock\n")],
      [I + "test_precreate_races.py::test_a1_same_id_and_try_queued_twice_creates_one_pod",
       REGRESSIONS + "test_a_superseded_launch_never_gets_a_pod"],
      None,
      note="the checker does not judge creates (the check-then-create gap a2 is the reconcile's); survived test_a1 (it counts the pods left; the reconcile deletes the extra one next loop): "
           "test_a_superseded_launch_never_gets_a_pod counts the creates"),
    m("adopts_superseded_pod", "chosen",
      "adoption takes a dead scheduler's pod of a superseded launch (c)",
      [(V, "    if token != launch.token:\n        return Verdict(False, True, Reason.SUPERSEDED)\n", "")],
      [I + "test_postcreate_races.py::test_c_adoption_takes_the_live_pod_not_the_stale_one"],
      "superseded_pending_lingers"),
    m("stale_event_frees_the_newer_slot", "chosen",
      "a stale launch's event frees the slot a newer launch of the same key holds",
      [(V, "    return holder == (as_token(launch.token) or \"\")\n", "    return True\n")],
      [I + "test_launch_standing.py::test_stale_event_keeps_the_newer_launch_slot"],
      "slot_held"),
    m("legacy_row_is_evidence", "chosen",
      "a row without a token (stock's or pre-upgrade) makes every launch of its task superseded",
      [(V, "    if row.token is None:\n        return Standing.LEGACY_ROW\n", "")],
      [I + "test_postcreate_races.py::test_sweep_and_fences_never_touch_legacy_or_current_pods",
       I + "test_executor_contract.py::test_legacy_rows_and_pods_get_the_stock_treatment",
       U + "test_verdicts.py"],
      None, note="every row of the checker's worlds has a token"),
    m("legacy_launch_judged", "chosen",
      "a tokenless (pre-upgrade) launch is judged against its task's row",
      [(V, "    if launch is None or launch.legacy or launch.task is None:\n",
           "    if launch is None or launch.task is None:\n")],
      [I + "test_executor_contract.py::test_legacy_rows_and_pods_get_the_stock_treatment", U + "test_verdicts.py"],
      "bystander_deleted"),
    m("task_gone_is_no_evidence", "chosen",
      "a launch whose task has no row any more is never fenced",
      [(V, "    if row is None:\n        return Standing.TASK_GONE\n    if row.token", "    if row is None:\n"
           "        return Standing.LEGACY_ROW\n    if row.token")],
      [U + "test_verdicts.py", I + "test_postcreate_races.py::test_d_sweep_removes_stale_pods_no_watcher_reports"],
      None, note="the checker never deletes a run or a DAG"),
    m("host_rule_off_in_the_reconcile", "chosen",
      "the loop's reconcile does not tell it the pod's name: the row's host is deleted once superseded",
      [(FI, "        verdict = self._delete_verdict(f.launch, row, f.name)\n",
            "        verdict = self._delete_verdict(f.launch, row, \"\")\n"),
       (FI, "        if f.uid is not None and verdicts.host_unresolved(row, f.name):\n", "        if False:\n")],
      [I + "test_fence_by_launch.py::test_the_pod_the_task_last_ran_on_is_left_to_finish_until_the_next_try_starts"],
      "host_pod_deleted"),
    m("host_named_by_prefix", "chosen",
      "a host name that merely starts with the pod's name (another pod's) counts as the pod",
      [(LA, 'host.startswith(pod.lower() + ".")', "host.startswith(pod.lower())")],
      [U + "test_launch.py", EDGES], None, note="pod names of one task share no prefix in the checker's worlds"),
    m("gone_pods_not_reported_after_a_relist", "chosen",
      "pods that left while the watch was down are not handed to the loop after the relist: their slots stay held",
      [(IF, "                self._drop(key, gone=key not in listed)\n", "                self._drop(key)\n")],
      [U + "test_in_flight.py", EDGES], "slot_held",
      note="survived test_in_flight; the provider's resilient watcher also reports pods that vanished during a gap"),
    m("terminating_pods_offered", "chosen",
      "pods already terminating are offered again every loop",
      [(IF, "if ref.launch is not None and not ref.deleting and ref.uid", "if ref.launch is not None and ref.uid")],
      [U + "test_in_flight.py"], None, note="a second delete of a terminating pod breaks no promise"),
    m("identity_without_the_server", "chosen",
      "the deployment id names the database and schema but not the server: two clusters' 'airflow' share it",
      [(DEP, '    return _hashed("identity", backend, server, database, schema or "")\n',
             '    return _hashed("identity", backend, database, schema or "")\n')],
      [U + "test_deployment.py",
       I + "test_identity_contract.py::test_two_databases_behind_one_proxy_address_get_two_ids"],
      "bystander_deleted"),
    m("run_gate_open", "chosen (the launch gate, issue 8)",
      "the api-server's run gate lets a superseded launch's /run through",
      [("fenced_k8s_executor/run_gate.py", "        if current is None or current == claim:\n",
        "        if True:\n")],
      [I + "test_launch_gate.py::test_run_with_stale_claim_is_rejected_and_not_started"],
      "superseded_wins_run"),
    m("revoke_leaves_other_tries", "chosen",
      "the revoke deletes only what the provider's own revoke finds (by coordinates and try)",
      [(FH, "        if not self._fencing:\n            return\n        for namespace in self._namespaces():\n",
            "        if True:\n            return\n        for namespace in self._namespaces():\n")],
      [I + "test_inflight_reconcile.py::test_pending_pod_of_a_revoked_launch_never_outlives_one_loop"],
      "superseded_pending_lingers",
      note="the loop's reconcile deletes what the revoke left within the same loop: the promise holds without it"),
)

BY_NAME = {mutant.name: mutant for mutant in MUTANTS}
assert len(BY_NAME) == len(MUTANTS), "mutant names must be unique"
