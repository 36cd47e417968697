"""The fences' wall-clock bounds: the watchdog's cut on a real socket, and the bounds derived from
``[scheduler] scheduler_health_check_threshold`` (issue 52, item 5)."""

from __future__ import annotations

import socket
import threading

import pytest

from fenced_k8s_executor import db, watchdog


class Connection:
    """A DBAPI connection as the watchdog sees one: a socket behind ``fileno()``."""

    def __init__(self, sock: socket.socket):
        self.sock = sock

    def fileno(self) -> int:
        return self.sock.fileno()


@pytest.fixture
def pair():
    client, server = socket.socketpair()
    yield client, server
    client.close()
    server.close()


def test_an_operation_past_its_deadline_is_woken_by_the_cut_and_its_connection_is_marked(pair):
    """A thread blocked reading a silent peer (as libpq waits for a server's answer) is woken by the
    cut with end-of-stream, whatever the peer does; the connection is marked cut for good."""
    client, _server = pair
    connection = Connection(client)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(client.recv(1)), daemon=True)
    reader.start()

    watch = watchdog.arm(connection, 0.0, "statement")
    reader.join(60)

    assert not reader.is_alive() and received == [b""]
    assert watchdog.disarm(watch) is True
    assert watchdog.cut(connection)


def test_an_operation_done_in_time_is_never_cut(pair):
    client, server = pair
    connection = Connection(client)
    watch = watchdog.arm(connection, 3600.0, "statement")
    server.sendall(b"x")
    assert client.recv(1) == b"x"

    assert watchdog.disarm(watch) is False
    assert watchdog.disarm(watch) is False  # ending it twice changes nothing
    assert not watchdog.cut(connection)
    client.sendall(b"y")  # the connection is whole
    assert server.recv(1) == b"y"


def test_a_connection_without_a_socket_is_not_watched():
    class Closed:
        def fileno(self) -> int:
            raise OSError("the connection is closed")

    assert watchdog.arm(Closed(), 1.0, "statement") is None
    assert watchdog.disarm(None) is False


def test_the_shipped_bounds_take_half_of_the_default_threshold_at_most():
    shipped = db.bounds_for(30)
    assert (shipped.operation, shipped.connect, shipped.statement_ms) == (db.OPERATION_BOUND, db.CONNECT_TIMEOUT,
                                                                          4_000)
    assert shipped.statement_ms < 1000 * shipped.operation  # a live server cancels before the cut
    assert shipped.holds and shipped.per_use <= 15


@pytest.mark.parametrize("threshold", [14, 16, 20, 24, 28, 30, 60, 3600])
def test_the_bounds_follow_the_threshold_and_hold_from_14_s(threshold):
    bounds = db.bounds_for(threshold)
    assert bounds.holds and bounds.per_use <= threshold / 2
    assert bounds.connect >= db.CONNECT_FLOOR and bounds.operation >= db.OPERATION_FLOOR
    assert bounds.statement_ms < 1000 * bounds.operation


@pytest.mark.parametrize("threshold", [0, 1, 5, 13])
def test_below_14_s_the_floors_hold_and_say_they_do_not_fit(threshold):
    """A threshold this low is refused nowhere (integration tests run at 1 s): the floors hold, and
    the pool's build logs that a use may take more than half the threshold."""
    bounds = db.bounds_for(threshold)
    assert (bounds.operation, bounds.connect) == (db.OPERATION_FLOOR, db.CONNECT_FLOOR)
    assert not bounds.holds
