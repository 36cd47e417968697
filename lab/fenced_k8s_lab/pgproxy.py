"""A loopback PostgreSQL proxy that routes each connection by its user name.

It stands for what issue 35 found in production: a Cloud SQL Auth Proxy or a pgbouncer sidecar
gives every deployment the same address (``127.0.0.1:5432/airflow``) for different databases.
Two deployments' schedulers reach two servers through one address here, told apart only by the
user in the connection's startup packet (credentials are no part of an address-derived id).

It reads the startup packet (answering an SSL or GSS encryption request with "N", as a server
without TLS does), connects to the route of its ``user``, forwards the packet and then pipes bytes
both ways. Nothing else of the protocol is looked at.
"""

from __future__ import annotations

import socket
import struct
import threading
from typing import Iterable

_SSL_REQUEST, _GSS_REQUEST = 80877103, 80877104


class UserRoutingProxy:
    """``routes``: user name -> (host, port) of the PostgreSQL server that user's connections reach;
    ``host``: the address it listens on (a NAT hop's relay listens on its veth's)."""

    def __init__(self, routes: dict[str, tuple[str, int]], port: int = 0, host: str = "127.0.0.1"):
        self.routes = dict(routes)
        self._server = socket.create_server((host, port))
        self.port = self._server.getsockname()[1]
        self._stop = threading.Event()
        self._sockets: set[socket.socket] = set()
        self._thread = threading.Thread(target=self._accept, name="pgproxy", daemon=True)

    def start(self) -> "UserRoutingProxy":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        try:
            self._server.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread (a close alone does not)
        except OSError:
            pass
        self._server.close()
        for sock in list(self._sockets):
            _close(sock)
        self._thread.join(timeout=5)

    def url(self, user: str, database: str) -> str:
        return f"postgresql+psycopg2://{user}@127.0.0.1:{self.port}/{database}"

    def __enter__(self) -> "UserRoutingProxy":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        self._sockets.add(client)
        try:
            packet = _startup(client)
            backend = socket.create_connection(self.routes[_user(packet)])
        except (OSError, KeyError, ValueError):
            _close(client)
            return
        self._sockets.add(backend)
        backend.sendall(packet)
        threading.Thread(target=_pipe, args=(backend, client), daemon=True).start()
        _pipe(client, backend)


def _read(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ValueError("connection closed during the startup packet")
        data += chunk
    return data


def _startup(client: socket.socket) -> bytes:
    """The client's startup packet, after declining any encryption request."""
    while True:
        head = _read(client, 8)
        length, code = struct.unpack("!II", head)
        if code in (_SSL_REQUEST, _GSS_REQUEST) and length == 8:
            client.sendall(b"N")
            continue
        return head + _read(client, length - 8)


def _user(packet: bytes) -> str:
    fields: Iterable[bytes] = packet[8:].split(b"\x00")
    items = iter(fields)
    for key in items:
        value = next(items, b"")
        if key == b"user":
            return value.decode()
    raise ValueError("no user in the startup packet")


def _pipe(source: socket.socket, target: socket.socket) -> None:
    try:
        while chunk := source.recv(65536):
            target.sendall(chunk)
    except OSError:
        pass
    finally:
        _close(source)
        _close(target)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
