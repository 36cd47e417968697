"""Is a DB error worth retrying? Decided by the error's SQLSTATE class, the one vocabulary every
PostgreSQL driver (and proxy) shares, instead of by the driver's exception class.

Transient: the connection classes (``08``: the server or a proxy could not be reached, or dropped
the connection), operator intervention (``57P01`` admin shutdown, ``57P02`` crash shutdown, ``57P03``
cannot connect now: a restart or failover under way; ``57014`` a statement cancelled by its
timeout), insufficient resources (``53``: too many connections, out of memory or disk),
serialization failures and deadlocks (``40001``, ``40P01``), and a driver error with no SQLSTATE
at all raised as an OperationalError or InterfaceError (a socket that died before the server said
anything). Everything else is the server's deterministic answer to the statement (no privilege,
no such table, ``0A000`` feature not supported, ``XX000`` internal error, ...): asking again every
loop would never change it, so the caller must stop and say so.

MySQL reports no SQLSTATE class for lost connections: its client error numbers 2002, 2003, 2006
and 2013 count as transient.
"""

from __future__ import annotations

TRANSIENT_CLASSES = frozenset({"08", "53"})
TRANSIENT_STATES = frozenset({"57P01", "57P02", "57P03", "57014", "40001", "40P01"})
MYSQL_CONNECTION_ERRORS = frozenset({2002, 2003, 2006, 2013})


def of(error: BaseException) -> str | None:
    """The SQLSTATE of a driver error, or of the driver error a SQLAlchemy error wraps (psycopg2:
    ``pgcode``; psycopg 3: ``sqlstate``)."""
    for candidate in (error, getattr(error, "orig", None)):
        code = getattr(candidate, "pgcode", None) or getattr(candidate, "sqlstate", None)
        if isinstance(code, str) and code:
            return code
    return None


def transient(error: BaseException) -> bool:
    """True when asking again later may succeed (see the module docstring)."""
    code = of(error)
    if code is not None:
        return code[:2] in TRANSIENT_CLASSES or code in TRANSIENT_STATES
    driver = getattr(error, "orig", None) or error
    args = getattr(driver, "args", ())
    if args and isinstance(args[0], int) and args[0] in MYSQL_CONNECTION_ERRORS:
        return True
    names = {cls.__name__ for cls in type(driver).__mro__} | {cls.__name__ for cls in type(error).__mro__}
    return bool(names & {"OperationalError", "InterfaceError", "DisconnectionError", "TimeoutError",
                         "ConnectionError"})


def describe(error: BaseException) -> str:
    """One line for a log or an error message: the SQLSTATE and the server's first line."""
    driver = getattr(error, "orig", None) or error
    text = str(driver).strip().splitlines()
    first = text[0] if text else type(driver).__name__
    code = of(error)
    return f"{code} {first}" if code else f"{type(driver).__name__}: {first}"
