"""The aiohttp application: routing, discovery, audit + fault middleware, test-control routes.

One catch-all route parses kube paths itself, so unknown paths and methods get kube-shaped
Status errors (404/405) rather than aiohttp's HTML, and nothing a client sends can produce
an unhandled 500.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from dataclasses import dataclass

from aiohttp import web

from . import leases
from .controls import AUDIT_KEY, State
from .errors import ApiError, status_body
from .lease_resources import LeaseResources
from .resources import _json, parse_bool

__all__ = ["make_app", "parse_path", "Route"]

log = logging.getLogger(__name__)

CONTROL_PREFIX = "/_emulator/"
KUBE_VERSION = {"major": "1", "minor": "33", "gitVersion": "v1.33.0-fenced-emulator", "gitCommit": "emulator",
                "gitTreeState": "clean", "buildDate": "2025-01-01T00:00:00Z", "goVersion": "go1.24",
                "compiler": "gc", "platform": "linux/amd64"}
_VERBS = ["get", "list", "watch", "create", "update", "patch", "delete"]
API_RESOURCES = {
    "kind": "APIResourceList", "groupVersion": "v1",
    "resources": [
        {"name": "namespaces", "singularName": "namespace", "namespaced": False, "kind": "Namespace",
         "verbs": ["create", "delete", "get", "list", "watch"], "shortNames": ["ns"]},
        {"name": "pods", "singularName": "pod", "namespaced": True, "kind": "Pod", "verbs": _VERBS,
         "shortNames": ["po"], "categories": ["all"]},
        {"name": "pods/binding", "singularName": "", "namespaced": True, "kind": "Binding", "verbs": ["create"]},
        {"name": "pods/log", "singularName": "", "namespaced": True, "kind": "Pod", "verbs": ["get"]},
        {"name": "pods/status", "singularName": "", "namespaced": True, "kind": "Pod",
         "verbs": ["get", "patch", "update"]},
    ],
}
_GROUP_VERSION = {"groupVersion": leases.API_VERSION, "version": "v1"}
API_GROUP = {"kind": "APIGroup", "apiVersion": "v1", "name": leases.GROUP, "versions": [_GROUP_VERSION],
             "preferredVersion": _GROUP_VERSION}
API_GROUPS = {"kind": "APIGroupList", "apiVersion": "v1",
              "groups": [{k: v for k, v in API_GROUP.items() if k not in ("kind", "apiVersion")}]}
LEASE_RESOURCES = {
    "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": leases.API_VERSION,
    "resources": [{"name": "leases", "singularName": "lease", "namespaced": True, "kind": "Lease",
                   "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]}],
}
_LEASES_PREFIX = ["apis", leases.GROUP, "v1"]


@dataclass(frozen=True)
class Route:
    resource: str | None  # "pods" | "namespaces" | "leases" | None (discovery / unknown)
    namespace: str | None = None
    name: str | None = None
    sub: str | None = None
    watch_path: bool = False  # legacy /api/v1/watch/... form


def _parse_lease_path(rest: list[str]) -> Route:
    """`rest` follows /apis/coordination.k8s.io/v1: [watch/]leases or [watch/]namespaces/NS/leases[/NAME]."""
    watch = rest[:1] == ["watch"]
    rest = rest[1:] if watch else rest
    if rest == ["leases"]:
        return Route("leases", watch_path=watch)
    if len(rest) < 3 or rest[0] != "namespaces" or rest[2] != "leases" or len(rest) > 5:
        return Route(None)
    return Route("leases", rest[1], rest[3] if len(rest) > 3 else None, rest[4] if len(rest) > 4 else None, watch)


def parse_path(path: str) -> Route:
    seg = [s for s in path.split("/") if s]
    if seg[:3] == _LEASES_PREFIX and len(seg) > 3:
        return _parse_lease_path(seg[3:])
    watch = False
    if seg[:3] == ["api", "v1", "watch"]:
        seg, watch = seg[:2] + seg[3:], True
    if seg[:2] != ["api", "v1"] or len(seg) < 3:
        return Route(None)
    rest = seg[2:]
    if rest[0] == "pods" and len(rest) == 1:
        return Route("pods", watch_path=watch)
    if rest[0] != "namespaces":
        return Route(None)
    if len(rest) == 1:
        return Route("namespaces", watch_path=watch)
    if len(rest) == 2:
        return Route("namespaces", name=rest[1], watch_path=watch)
    if rest[2] != "pods" or len(rest) > 5:
        return Route(None)
    return Route("pods", rest[1], rest[3] if len(rest) > 3 else None, rest[4] if len(rest) > 4 else None, watch)


def _verb(method: str, route: Route, query) -> str:
    if method == "GET":
        if route.name:
            return "get"
        return "watch" if route.watch_path or query.get("watch") in ("1", "t", "T", "TRUE", "true", "True") else "list"
    if method == "DELETE" and route.resource is not None and route.name is None:
        return "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method, method.lower())


def _not_found_path() -> ApiError:
    return ApiError(404, "the server could not find the requested resource")


def _not_allowed(method: str) -> ApiError:
    return ApiError(405, f"the server does not allow this method on the requested resource ({method})")


async def _hang_then_drop(request: web.Request, seconds: float | None) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + (seconds if seconds is not None else 3600)
    while loop.time() < end and request.transport is not None and not request.transport.is_closing():
        await asyncio.sleep(0.1)
    if request.transport is not None:
        request.transport.close()


def make_app(state: State) -> web.Application:
    res = LeaseResources(state)

    @web.middleware
    async def middleware(request: web.Request, handler):
        if request.path.startswith(CONTROL_PREFIX):
            try:
                return await handler(request)
            except ApiError as exc:
                return web.json_response(exc.body, status=exc.code)
            except (ValueError, TypeError, KeyError, AttributeError, re.error) as exc:
                return web.json_response({"error": f"{type(exc).__name__}: {exc}"}, status=400)
        route = parse_path(request.path)
        who = state.who(request.headers.get("Authorization"))
        entry = state.audit_begin(who=who, verb=_verb(request.method, route, request.query), path=request.path,
                                  query=request.query_string, namespace=route.namespace,
                                  name=route.name if route.resource == "pods" else route.name,
                                  resource=route.resource, subresource=route.sub,
                                  user_agent=request.headers.get("User-Agent"))
        request[AUDIT_KEY] = entry
        fault = state.take_fault(request.method, request.path, who)
        try:
            if fault is not None:
                entry["fault"] = fault.id
                if fault.delay:
                    await asyncio.sleep(fault.delay)
                if fault.drop:
                    entry["code"] = 0
                    if request.transport is not None:
                        request.transport.close()
                    return web.Response(status=500)
                if fault.status is not None:
                    raise ApiError(fault.status, fault.message or f"injected fault {fault.id}")
            resp = await handler(request)
            if fault is not None and fault.persist_then_timeout:
                entry["code"] = 0
                await _hang_then_drop(request, fault.hang_seconds)
                return resp
            entry["code"] = resp.status
            return resp
        except ApiError as exc:
            entry["code"] = exc.code
            headers = {"Retry-After": "1"} if exc.code == 429 else None
            return web.json_response(exc.body, status=exc.code, headers=headers)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never crash the server on bad input
            log.exception("emulator bug handling %s %s", request.method, request.path)
            entry["code"] = 500
            return web.json_response(status_body(500, f"emulator internal error: {exc!r}"), status=500)

    async def kube(request: web.Request) -> web.StreamResponse:
        path, m = request.path.rstrip("/") or "/", request.method
        if path in ("/healthz", "/readyz", "/livez"):
            return web.Response(text="ok")
        if path == "/version":
            return _json(KUBE_VERSION)
        if path == "/api":
            return _json({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": request.host}]})
        if path == "/apis":
            return _json(API_GROUPS)
        if path == "/apis/" + leases.GROUP:
            return _json(API_GROUP)
        if path == "/apis/" + leases.API_VERSION:
            return _json(LEASE_RESOURCES)
        if path == "/api/v1":
            return _json(API_RESOURCES)
        r = parse_path(path)
        if r.resource is None:
            raise _not_found_path()
        if r.watch_path and (m != "GET" or r.name):
            raise _not_found_path()
        if r.watch_path:
            request = request.clone(rel_url=request.rel_url.update_query({"watch": "true"}))
        if r.resource == "namespaces":
            if r.name is None:
                if m == "GET":
                    return await res.list_or_watch(request, "namespaces", None)
                if m == "POST":
                    return await res.create_namespace(request)
            else:
                if m == "GET":
                    return await res.get(request, "namespaces", "", r.name)
                if m == "DELETE":
                    return await res.delete_namespace(request, r.name)
            raise _not_allowed(m)
        if r.resource == "leases":
            return await _leases(request, r)
        ns, name, sub = r.namespace, r.name, r.sub
        if name is None:
            if m == "GET":
                return await res.list_or_watch(request, "pods", ns)
            if m == "POST" and ns is not None:
                return await res.create_pod(request, ns)
            raise _not_allowed(m)
        if sub is None:
            handlers = {"GET": lambda: res.get(request, "pods", ns, name),
                        "PUT": lambda: res.replace_pod(request, ns, name, status=False),
                        "PATCH": lambda: res.patch_pod(request, ns, name, status=False),
                        "DELETE": lambda: res.delete_pod(request, ns, name)}
        elif sub == "status":
            handlers = {"GET": lambda: res.get(request, "pods", ns, name),
                        "PUT": lambda: res.replace_pod(request, ns, name, status=True),
                        "PATCH": lambda: res.patch_pod(request, ns, name, status=True)}
        elif sub == "binding":
            handlers = {"POST": lambda: res.bind_pod(request, ns, name)}
        elif sub == "log":
            handlers = {"GET": lambda: res.pod_log(request, ns, name)}
        else:
            raise _not_found_path()
        if m not in handlers:
            raise _not_allowed(m)
        return await handlers[m]()

    async def _leases(request: web.Request, r: Route) -> web.StreamResponse:
        m, ns, name = request.method, r.namespace, r.name
        if r.sub is not None:
            raise _not_found_path()
        if name is None:
            handlers = {"GET": lambda: res.list_or_watch(request, "leases", ns)}
            if ns is not None:
                handlers["POST"] = lambda: res.create_lease(request, ns)
                handlers["DELETE"] = lambda: res.delete_lease_collection(request, ns)
        else:
            handlers = {"GET": lambda: res.get(request, "leases", ns, name),
                        "PUT": lambda: res.replace_lease(request, ns, name),
                        "PATCH": lambda: res.patch_lease(request, ns, name),
                        "DELETE": lambda: res.delete_lease(request, ns, name)}
        if m not in handlers:
            raise _not_allowed(m)
        return await handlers[m]()

    app = web.Application(middlewares=[middleware], client_max_size=3 * 1024 * 1024)
    _add_controls(app, state)
    app.router.add_route("*", "/{tail:.*}", kube)
    return app


def _add_controls(app: web.Application, state: State) -> None:
    """HTTP test controls; each maps onto one State method."""
    p = CONTROL_PREFIX

    async def body_json(request):
        raw = await request.read()
        return json.loads(raw) if raw.strip() else {}

    def ok(**extra):
        return web.json_response({"ok": True, **extra})

    async def compact(request):
        return ok(resourceVersion=str(state.compact()))

    async def close_watches(request):
        return ok(closed=state.close_watches())

    async def bookmark(request):
        return ok(watchers=state.bookmark())

    async def reset(request):
        state.reset()
        return ok()

    async def add_faults(request):
        spec = await body_json(request)
        specs = spec if isinstance(spec, list) else [spec]
        return ok(ids=[state.add_fault(s) for s in specs])

    async def get_faults(request):
        return web.json_response(state.list_faults())

    async def del_faults(request):
        fid = request.match_info.get("id")
        state.clear_faults(int(fid) if fid else None)
        return ok()

    async def audit(request):
        return web.json_response(state.audit(int(request.query.get("since", 0))))

    async def del_audit(request):
        state.clear_audit()
        return ok()

    async def tokens(request):
        state.set_tokens(await body_json(request))
        return ok()

    async def summary(request):
        return web.json_response(state.summary())

    async def logs(request):
        ns, name = request.match_info["ns"], request.match_info["name"]
        container = request.query.get("container")
        if request.method == "GET":
            data = state.read_log(ns, name, container)
            return web.Response(body=data or b"", content_type="text/plain")
        if request.method == "DELETE":
            state.logs.pop((ns, name, container), None)
            state.log_files.pop((ns, name, container), None)
            return ok()
        data = await request.read()
        (state.append_log if request.method == "POST" else state.set_log)(ns, name, data, container)
        return ok()

    async def logfile(request):
        spec = await body_json(request)
        state.set_log_file(request.match_info["ns"], request.match_info["name"], spec["path"],
                           spec.get("container") or request.query.get("container"))
        return ok()

    r = app.router
    r.add_post(p + "compact", compact)
    r.add_post(p + "close-watches", close_watches)
    r.add_post(p + "bookmark", bookmark)
    r.add_post(p + "reset", reset)
    r.add_post(p + "faults", add_faults)
    r.add_get(p + "faults", get_faults)
    r.add_delete(p + "faults", del_faults)
    r.add_delete(p + "faults/{id}", del_faults)
    r.add_get(p + "audit", audit)
    r.add_delete(p + "audit", del_audit)
    r.add_post(p + "tokens", tokens)
    r.add_get(p + "state", summary)
    r.add_route("*", p + "logs/{ns}/{name}", logs)
    r.add_post(p + "logfiles/{ns}/{name}", logfile)


__all__ += ["parse_bool"]
