"""pods.list_pages: the sweep's prefetching pager yields exactly what the plain pager yields, in
order, and hands a failed list to its caller (the sweep's "no evidence, next interval")."""

from __future__ import annotations

import threading

import pytest
from kubernetes.client.rest import ApiException

from fenced_k8s_executor import pods


class _Server:
    """Serves ``pages`` of pod metadata by continue token, like a paginated LIST; records who asked."""

    def __init__(self, pages: list[list[str]], fail_at: int | None = None):
        self.pages, self.fail_at = pages, fail_at
        self.threads: list[str] = []

    def call_api(self, path, method, *, query_params, **_):
        token = dict(query_params).get("continue")
        index = int(token) if token else 0
        self.threads.append(threading.current_thread().name)
        if index == self.fail_at:
            raise ApiException(status=500, reason="boom")
        more = index + 1 < len(self.pages)
        items = [{"metadata": {"name": n, "namespace": "ns", "uid": f"uid-{n}"}} for n in self.pages[index]]
        return {"items": items, "metadata": {"continue": str(index + 1) if more else ""}}


class _Client:
    def __init__(self, server: _Server):
        self.api_client = server


PAGES = [[f"p{i}-{j}" for j in range(3)] for i in range(5)]


@pytest.mark.parametrize("prefetch", [False, True])
def test_every_page_in_order(prefetch):
    server = _Server(PAGES)
    got = [[ref.name for ref in page]
           for page in pods.list_pages(_Client(server), "ns", label_selector="x", prefetch=prefetch)]
    assert got == PAGES
    assert len(server.threads) == len(PAGES)  # one list call per page, none beyond the last
    assert all(name == "fenced-k8s-list" for name in server.threads) is prefetch


def test_a_failed_page_is_raised_to_the_caller_after_the_pages_before_it():
    seen = []
    with pytest.raises(ApiException):
        for page in pods.list_pages(_Client(_Server(PAGES, fail_at=2)), "ns", label_selector="x", prefetch=True):
            seen.append(page)
    assert len(seen) == 2
