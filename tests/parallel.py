"""How the default run spreads over pytest-xdist workers (``addopts`` in pyproject.toml:
``-n 4 --dist loadgroup``; ``-n 0`` runs everything in one process, in the same order).

Each worker is a pytest session of its own, so it has its own session fixtures: its PostgreSQL
server (a copy of the cached migrated template, on a free port), its emulator, its real
kube-apiserver + etcd, its temporary folders (``tmp_path``: one base per worker). Tests are sent
one at a time, except two kinds of groups (``xdist_group`` marks, set here at collection):

- a module whose tests share a module- or class-scoped fixture (a stack of real processes, a
  wheel build, a scheduler run of every typo...) goes whole to one worker, in its order, so the
  fixture is made once as in a serial run, not once per worker or per interleaving;
- ``serial``: the tests on the real node (``real_node``, ``tests/kind``) and those marked
  ``@pytest.mark.serial`` run last, on one worker, once every other worker has finished and
  stopped (with its PostgreSQL, emulator and apiserver): nothing else runs beside them, as in
  the serial run where they came last.

pytest-xdist 3.8's own ``loadgroup`` cannot see the groups under pytest 9 (it renames the test to
``<id>@<group>`` through an attribute pytest 9 no longer reads), so the scheduler here learns them
from a file each worker writes at collection (``groups-<worker>.json`` in a folder of the run),
and the tests keep their own ids.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

SERIAL = "serial"
_GROUPS_DIR = pytest.StashKey[str]()


def needs_node(item) -> bool:
    params = getattr(getattr(item, "callspec", None), "params", {})
    return "real_node" in getattr(item, "fixturenames", ()) or params.get("ground") == "node"


def _in_kind(item) -> bool:
    return "tests/kind/" in str(item.path).replace("\\", "/")


def _shares_module_fixture(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    for defs in (info.name2fixturedefs.values() if info else ()):
        if any(str(d.scope) in ("module", "class", "package") for d in defs):
            return True
    return False


def group_of(item) -> str | None:
    if needs_node(item) or _in_kind(item) or item.get_closest_marker(SERIAL):
        return SERIAL
    if _shares_module_fixture(item):
        return item.nodeid.split("::", 1)[0]  # the module's path
    return None


def add_groups(config, items) -> None:
    for item in items:
        group = group_of(item)
        if group is not None and not item.get_closest_marker("xdist_group"):
            item.add_marker(pytest.mark.xdist_group(group))


def write_groups(config, items) -> None:
    """On a worker: test id -> group, for the controller's scheduler."""
    where = getattr(config, "workerinput", {}).get("fenced_groups_dir")
    if not where:
        return
    groups = {}
    for item in items:
        mark = item.get_closest_marker("xdist_group")
        if mark is not None:
            groups[item.nodeid] = str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
    path = Path(where) / f"groups-{config.workerinput['workerid']}.json"
    path.with_suffix(".tmp").write_text(json.dumps(groups))
    os.replace(path.with_suffix(".tmp"), path)


def configure_node(node) -> None:
    """On the controller, before a worker starts: where it writes its groups."""
    config = node.config
    if _GROUPS_DIR not in config.stash:
        config.stash[_GROUPS_DIR] = tempfile.mkdtemp(prefix="fenced-xdist-groups-")
    node.workerinput["fenced_groups_dir"] = config.stash[_GROUPS_DIR]


def unconfigure(config) -> None:
    if _GROUPS_DIR in config.stash:
        shutil.rmtree(config.stash[_GROUPS_DIR], ignore_errors=True)


def _own_id(nodeid: str) -> str:
    """The test's id without xdist's ``@<group>`` (an ``@`` inside a parameter id stays)."""
    at = nodeid.rfind("@")
    return nodeid[:at] if at > nodeid.rfind("]") else nodeid


def strip_group(report) -> None:
    """Should a later xdist name grouped tests ``<id>@<group>`` again: reports keep the id."""
    if getattr(report, "node", None) is not None and "@" in report.nodeid:  # from a worker
        report.nodeid = _own_id(report.nodeid)


def make_scheduler(config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class SerialLast(LoadGroupScheduling):
        """``loadgroup`` with the groups the workers wrote, and the ``serial`` group run alone at
        the end: workers that run out of other work are stopped, the last one left runs it."""

        groups: dict | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:
                found = sorted(Path(config.stash[_GROUPS_DIR]).glob("groups-*.json")) if _GROUPS_DIR in config.stash else []
                self.groups = json.loads(found[0].read_text()) if found else {}
            return self.groups.get(nodeid) or super()._split_scope(nodeid)

        def _assign(self, node, scope: str) -> None:
            work_unit = self.workqueue.pop(scope)
            self.assigned_work.setdefault(node, {})[scope] = work_unit
            collection = self.registered_collections[node]
            node.send_runtest_some([collection.index(nodeid) for nodeid, done in work_unit.items() if not done])

        def _assign_work_unit(self, node) -> None:
            scope = next((s for s in self.workqueue if s != SERIAL), None)
            if scope is not None:
                self._assign(node, scope)

        def _reschedule(self, node) -> None:
            if node.shutting_down:
                return
            if not self.workqueue:
                node.shutdown()
                return
            if self._pending_of(self.assigned_work[node]) > 2:
                return
            if any(s != SERIAL for s in self.workqueue):
                self._assign_work_unit(node)
                return
            # Only the serial group is left: stop this worker unless it is the last one.
            if sum(not n.shutting_down for n in self.nodes) > 1:
                node.shutdown()
                return
            self._start_serial()

        def _start_serial(self) -> None:
            if SERIAL in self.workqueue and len(self.nodes) == 1 and not any(s != SERIAL for s in self.workqueue):
                (node,) = self.nodes
                if not node.shutting_down:
                    self._assign(node, SERIAL)

        def remove_node(self, node):
            crashed = super().remove_node(node)
            self._start_serial()  # the others have stopped: the last worker runs the group
            return crashed

    return SerialLast(config, log)

# ------------------------------------------------------------------ end-of-run summary sections
#: Sections of the end-of-run summary, title -> lines. A test adds lines in the process it runs
#: in (a worker); the controller prints them (a worker's summary is never shown): each worker's
#: sections go to it with the worker's end (``workeroutput``).
_SECTIONS = pytest.StashKey[dict]()


def summary_lines(config, title: str) -> list[str]:
    """The lines of the end-of-run summary's section ``title``: append to it."""
    return config.stash.setdefault(_SECTIONS, {}).setdefault(title, [])


def send_sections(config) -> None:
    out = getattr(config, "workeroutput", None)
    if out is not None and config.stash.get(_SECTIONS, None):
        out["summary_sections"] = config.stash[_SECTIONS]


def receive_sections(config, node) -> None:
    for title, lines in getattr(node, "workeroutput", {}).get("summary_sections", {}).items():
        summary_lines(config, title).extend(lines)


def write_sections(terminalreporter) -> None:
    for title, lines in terminalreporter.config.stash.get(_SECTIONS, {}).items():
        if lines:
            terminalreporter.section(title)
            for line in lines:
                terminalreporter.write_line(line)
