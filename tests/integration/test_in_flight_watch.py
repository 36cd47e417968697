"""The watch of this deployment's pods in flight against an API that misbehaves the way proxies do
(issue 35, "also look into"): a watch answered at once with an empty body, and lists that never
answer. A real HTTP server plays the proxy; the real kubernetes client talks to it."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from fenced_k8s_executor.in_flight import STOP_WAIT, InFlightPods

EMPTY_LIST = {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "7"}, "items": []}


class _Proxy(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, hang_lists: bool):
        self.hang_lists = hang_lists
        self.watches = 0
        self.lists = 0
        self.release = threading.Event()
        super().__init__(("127.0.0.1", 0), _Handler)


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        server: _Proxy = self.server  # type: ignore[assignment]
        if "watch=true" in self.path:
            server.watches += 1  # a proxy that closes every watch at once, cleanly, with no event
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        server.lists += 1
        if server.hang_lists:
            server.release.wait(60)  # a list nobody answers (an API outage behind a proxy)
        body = json.dumps(EMPTY_LIST).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def proxy(request):
    server = _Proxy(hang_lists=request.param)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.release.set()
    server.shutdown()
    server.server_close()


def _client(server: _Proxy):
    from kubernetes import client

    config = client.Configuration(host=f"http://127.0.0.1:{server.server_address[1]}")
    config.api_key = {"authorization": "Bearer test"}
    return client.CoreV1Api(client.ApiClient(config))


@pytest.mark.parametrize("proxy", [False], indirect=True)
def test_a_watch_that_ends_at_once_is_retried_with_back_off_not_spun(proxy):
    """Before: the thread asked again at once, as fast as the proxy answered (thousands per second)."""
    pods = InFlightPods(_client(proxy), ["ns"], "dep", request_args={"_request_timeout": (2, 2)})
    assert pods.start(wait=5)
    time.sleep(3.0)
    pods.stop()
    assert 1 <= proxy.watches <= 8, f"{proxy.watches} watch requests in 3 s"


@pytest.mark.parametrize("proxy", [True], indirect=True)
def test_stopping_never_waits_for_each_list_in_turn(proxy):
    """Before: ``stop`` joined each namespace's thread for 2 s in turn, so with the API down eight
    namespaces held ``end()`` 16 s, past the chart's 10 s termination grace (the Job was never closed)."""
    namespaces = [f"ns-{i}" for i in range(8)]
    pods = InFlightPods(_client(proxy), namespaces, "dep", request_args={"_request_timeout": (60, 60)})
    assert not pods.start(wait=0.5)  # nothing answered: the scheduler starts anyway
    deadline = time.monotonic() + 10
    while proxy.lists < len(namespaces) and time.monotonic() < deadline:
        time.sleep(0.05)
    began = time.monotonic()
    pods.stop()
    assert time.monotonic() - began < STOP_WAIT + 2.0  # well inside the chart's 10 s grace
