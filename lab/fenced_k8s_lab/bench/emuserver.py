"""The benchmark's emulator process: the lab's Kubernetes API emulator plus two bench-only things.

    python -m fenced_k8s_lab.bench.emuserver --port 0 [--history-size N] [--tokens JSON]
        [--stock-pagination]

1. ``POST /_bench/fill`` builds executor pods inside the emulator process from compact rows
   (``{"namespace", "rows": [[ti_id, dag_id, task_id, run_id, token], ...], "job_id"}``) through
   the emulator's own ``prepare_pod`` and ``Store.write``: 100,000 pods in seconds, without
   100,000 HTTP round trips or audit entries. ``GET /_bench/count?namespace=`` counts pods,
   ``POST /_bench/clear`` drops a namespace's pods (``Store.remove``: DELETED events as usual).
2. Paginated lists (``limit`` + ``continue``) scan the list snapshot lazily from the continue
   offset and stop after one page, as kube-apiserver does (it reads one page from etcd or the
   watch cache). The lab emulator's own handler (``kubeapi/resources.py``) filters the whole rest of the
   snapshot for every page, so a paginated list of N pods costs O(N^2 / page) there: ~30 s of
   emulator time at 100,000 pods, which would be charged to the sweep. Responses, continue tokens
   and snapshot semantics are unchanged (same snapshot ids, same offsets). ``--stock-pagination``
   keeps the emulator's handler (to measure the difference).

Prints ``READY <url>`` like ``python -m fenced_k8s_lab.kubeapi``.
"""

from __future__ import annotations

import argparse
import base64
import json
import signal
import sys
import threading

from aiohttp import web

from fenced_k8s_lab.kubeapi import emulator as emu_mod
from fenced_k8s_lab.kubeapi import objects, resources
from fenced_k8s_lab.kubeapi.server import make_app
from fenced_k8s_lab.kubeapi.store import Expired


def _lazy_list(original):
    async def list_or_watch(self, request: web.Request, resource: str, ns: str | None) -> web.StreamResponse:
        q = request.query
        limit = resources._int(request, "limit") or 0
        if resources.parse_bool(q.get("watch"), "watch") or limit <= 0:
            return await original(self, request, resource, ns)
        _, list_kind, fields, api_version, _ = resources._KINDS[resource]
        try:
            labels = resources.parse_label_selector(q.get("labelSelector"))
            fsel = resources.parse_field_selector(q.get("fieldSelector"), fields)
        except resources.SelectorError as exc:
            raise resources.ApiError.bad_request(str(exc))
        partial = resources.negotiate(request.headers.get("Accept"), is_list=True)
        token = q.get("continue")
        if token:
            try:
                data = json.loads(base64.urlsafe_b64decode(token.encode()))
                sid, offset = int(data["s"]), int(data["o"])
            except Exception:
                raise resources.ApiError.bad_request("continue key is not valid: incorrect encoded start resourceVersion")
            try:
                rv, snapshot = self.store.snapshot_get(sid)
            except Expired as exc:
                raise resources.ApiError(410, str(exc), "Expired")
        else:
            rv, snapshot, sid, offset = self.store.rv, self.store.list(resource, ns), None, 0
        items: list[dict] = []
        last = more = None
        for i in range(offset, len(snapshot)):
            o = snapshot[i]
            if labels.matches(o["metadata"].get("labels")) and fsel.matches(o):
                if len(items) == limit:
                    more = i
                    break
                items.append(o)
                last = i
        meta = {"resourceVersion": str(rv)}
        if more is not None:
            if sid is None:
                sid = self.store.snapshot(rv, snapshot)
            meta["continue"] = base64.urlsafe_b64encode(
                json.dumps({"s": sid, "o": last + 1, "rv": rv}).encode()).decode()
            if labels.empty and fsel.empty:
                meta["remainingItemCount"] = len(snapshot) - (last + 1)
        if partial:
            return resources._json({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
                                    "metadata": meta, "items": [objects.partial(o) for o in items]})
        return resources._json({"kind": list_kind, "apiVersion": api_version, "metadata": meta,
                                "items": [{k: v for k, v in o.items() if k not in ("kind", "apiVersion")}
                                          for o in items]})

    return list_or_watch


def _bench_middleware(state):
    from fenced_k8s_lab.bench.sweeping import pod_body

    store = state.store

    @web.middleware
    async def middleware(request: web.Request, handler):
        if not request.path.startswith("/_bench/"):
            return await handler(request)
        what = request.path[len("/_bench/"):]
        if what == "fill" and request.method == "POST":
            spec = await request.json()
            ns, job_id = spec["namespace"], int(spec.get("job_id", 1))
            for row in spec["rows"]:
                body = pod_body(tuple(row[:4]), row[4], job_id)
                pod = objects.prepare_pod(body, ns, lambda n: store.get("pods", ns, n) is not None)
                store.write("pods", pod, None)
            return web.json_response({"created": len(spec["rows"]), "pods": len(store.objects["pods"])})
        if what == "count":
            ns = request.query.get("namespace")
            return web.json_response({"pods": sum(1 for k in store.objects["pods"] if ns is None or k[0] == ns)})
        if what == "clear" and request.method == "POST":
            ns = (await request.json())["namespace"]
            keys = [k for k in store.objects["pods"] if k[0] == ns]
            for k in keys:
                store.remove("pods", *k)
            return web.json_response({"removed": len(keys)})
        return web.json_response({"error": "unknown bench control"}, status=404)

    return middleware


class BenchEmulator(emu_mod.Emulator):
    async def _serve(self) -> None:
        app = make_app(self.state)
        app.middlewares.insert(0, _bench_middleware(self.state))
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://{self.host}:{self.port}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--history-size", type=int, default=1000)
    ap.add_argument("--tokens", default="{}")
    ap.add_argument("--stock-pagination", action="store_true")
    args = ap.parse_args(argv)
    if not args.stock_pagination:
        resources.Resources.list_or_watch = _lazy_list(resources.Resources.list_or_watch)
    emu = BenchEmulator("127.0.0.1", args.port, history_size=args.history_size, tokens=json.loads(args.tokens))
    url = emu.start()
    print(f"READY {url}", flush=True)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    while not done.wait(1.0):
        pass
    emu.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
