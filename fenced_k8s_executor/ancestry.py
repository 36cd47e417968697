"""What this database remembers of its own lineage, in itself: the one place an original cannot copy
it from, and the one record a deleted or pruned witness Lease cannot take away.

Kept in the Airflow Variable ``VARIABLE`` (JSON, in clear like the deployment id: every component
must read it whatever its fernet key):

- ``copied_at``: this database is a copy taken about then (``lineage.View.copied_at``), written by
  the witness the first time it learns it (and when it learns a later date), read at every
  renewal: a copy stays one across a deleted Lease, pruned entries and scheduler restarts.
- ``gone``: schedulers an operator declared gone after a point-in-time restore of this deployment's
  own database (``airflow fenced-k8s restored``): the database they wrote to is this one's past,
  so their posts ahead of its rows are no evidence of a copy and their pods are this database's.
  Declaring clears ``copied_at``. A declared scheduler seen posting again was not gone: it counts
  as before (``lineage.judge``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Iterable

from fenced_k8s_executor.launch import Launcher

log = logging.getLogger("fenced_k8s_executor")

VARIABLE = "fenced_k8s_executor.lineage"
DESCRIPTION = ("fenced-k8s-executor: what this metadata database knows of its lineage (a copy's date, the "
               "schedulers declared gone by `airflow fenced-k8s restored`). Kept by the schedulers; not to edit.")


@dataclass(frozen=True)
class Record:
    copied_at: datetime | None = None
    gone: frozenset[Launcher] = frozenset()
    declared: datetime | None = None  # when an operator declared them gone


def parse(value: Any) -> Record:
    """The record a stored value holds; a value that does not read is an empty record (and said)."""
    if value is None:
        return Record()
    try:
        data = json.loads(value)
        copied = data.get("copied_at")
        gone = frozenset(Launcher(int(job), datetime.fromisoformat(started)) for job, started in data.get("gone", ()))
        declared = data.get("declared")
        return Record(datetime.fromisoformat(copied) if copied else None, gone,
                      datetime.fromisoformat(declared) if declared else None)
    except (TypeError, ValueError, AttributeError) as error:
        log.warning("fenced_k8s_executor the Variable %s does not read (%r): taken as empty", VARIABLE, error)
        return Record()


def dump(record: Record) -> str:
    return json.dumps({
        "copied_at": record.copied_at.astimezone(timezone.utc).isoformat() if record.copied_at else None,
        "gone": sorted([launcher.job_id, launcher.started.astimezone(timezone.utc).isoformat()]
                       for launcher in record.gone),
        "declared": record.declared.astimezone(timezone.utc).isoformat() if record.declared else None,
    }, separators=(",", ":"))


def read(session: Any = None) -> Record:
    """This database's record (empty when none is stored). Raises on DB errors."""
    if session is None:
        from fenced_k8s_executor import db

        with db.bounded_session() as session:
            return read(session)
    found = _stored(session, lock=False)
    return parse(None if found is None else found._val)


def remember_copy(at: datetime) -> Record:
    """Keep that this database is a copy taken about ``at`` (the later date wins). Raises on DB errors."""
    from fenced_k8s_executor import db

    with db.bounded_session() as session:
        found = _stored(session)
        before = parse(None if found is None else found._val)
        if before.copied_at is not None and before.copied_at >= at:
            return before
        return _store(session, Record(at, before.gone, before.declared))


def declare_gone(launchers: Iterable[Launcher], now: datetime, session: Any = None) -> Record:
    """An operator's word that the database these schedulers wrote to is gone (a restore replaced
    it): kept beside any declared before; the copy's date they gave is forgotten."""
    if session is None:
        from fenced_k8s_executor import db

        with db.bounded_session() as session:
            return declare_gone(launchers, now, session)
    found = _stored(session)
    before = parse(None if found is None else found._val)
    return _store(session, Record(None, before.gone | frozenset(launchers), now))


def _stored(session: Any, lock: bool = True) -> Any:
    from sqlalchemy import select

    from airflow.models.variable import Variable

    query = select(Variable).where(Variable.key == VARIABLE)
    return session.scalars(query.with_for_update() if lock else query).first()


def _store(session: Any, record: Record) -> Record:
    from airflow.models.variable import Variable

    variable = _stored(session)
    if variable is None:
        variable = Variable(key=VARIABLE, description=DESCRIPTION)
        session.add(variable)
    variable._val, variable.is_encrypted = dump(record), False
    return record
