"""Handlers for coordination.k8s.io/v1 leases, over the pods' and namespaces' `Resources`.

What kube-apiserver v1.36 does differently for a Lease than for a pod: a PUT may create one, an
update must carry metadata.resourceVersion, a body that does not decode is 400 (422 in a patch),
delete answers a Status, deletecollection is served. The Lease semantics themselves are pure, in
leases.py.
"""

from __future__ import annotations

from aiohttp import web

from . import leases, objects
from .errors import ApiError
from .resources import Resources, _body, _json, _patched
from .selectors import LEASE_FIELDS, SelectorError, parse_field_selector, parse_label_selector

__all__ = ["LeaseResources"]


class LeaseResources(Resources):
    @staticmethod
    def _decode_lease(body: object, in_patch: bool = False) -> dict:
        try:
            return leases.decode(body)
        except leases.LeaseDecodeError as exc:
            if in_patch:  # kube decodes the patched document: 422, not 400
                raise ApiError(422, f' "" is invalid: patch: Invalid value: "...": {exc}', "Invalid")
            raise ApiError.bad_request(f'Lease in version "v1" cannot be handled as a Lease: {exc}')

    def _new_lease(self, body: object, ns: str) -> dict:
        lease = self._decode_lease(body)
        self._ensure_namespace(ns)
        lease = leases.prepare_lease(lease, ns, lambda n: self.store.get("leases", ns, n) is not None)
        if (body.get("metadata") or {}).get("resourceVersion"):
            raise ApiError(500, "resourceVersion should not be set on objects to be created")  # as kube-apiserver
        name = lease["metadata"]["name"]
        if self.store.get("leases", ns, name) is not None:
            raise ApiError.already_exists("leases", name, leases.GROUP)
        return self.store.write("leases", lease, None)

    async def create_lease(self, request: web.Request, ns: str) -> web.Response:
        _, body = await _body(request)
        stored = self._new_lease(body, ns)
        self._audit_object(request, stored)
        return _json(stored, 201)

    def _check_rv(self, old: dict, rv: object, name: str) -> None:
        if rv and rv != old["metadata"]["resourceVersion"]:
            raise ApiError.conflict("leases", name, "the object has been modified; please apply your changes to the "
                                                    "latest version and try again", leases.GROUP)

    async def replace_lease(self, request: web.Request, ns: str, name: str) -> web.Response:
        """PUT: a Lease may be created by an update (kube's AllowCreateOnUpdate), and an update of an
        existing one must carry metadata.resourceVersion (no unconditional update)."""
        _, body = await _body(request)
        lease = self._decode_lease(body)
        meta = lease["metadata"]
        if not meta.get("name"):
            raise ApiError.bad_request(f"the name of the object ({name} based on URL) was undeterminable: name must "
                                       f"be provided")
        if meta["name"] != name:
            raise ApiError.bad_request(f"the name of the object ({meta['name']}) does not match the name on the URL "
                                       f"({name})")
        if meta.get("namespace") not in (None, "", ns):
            raise ApiError.bad_request("the namespace of the provided object does not match the namespace sent on "
                                       "the request")
        old = self.store.get("leases", ns, name)
        if old is None:
            body = {**body, "metadata": {k: v for k, v in meta.items() if k != "resourceVersion"}}
            stored = self._new_lease(body, ns)
            self._audit_object(request, stored)
            return _json(stored, 201)
        if not meta.get("resourceVersion"):
            raise ApiError.invalid("leases", name, ["metadata.resourceVersion: Invalid value: 0: must be specified "
                                                    "for an update"], leases.GROUP)
        self._check_rv(old, meta["resourceVersion"], name)
        return _json(self._commit("leases", old, leases.lease_update(old, lease)))

    async def patch_lease(self, request: web.Request, ns: str, name: str) -> web.Response:
        old = self._get("leases", ns, name)
        patched = await _patched(request, old)
        lease = self._decode_lease(patched, in_patch=True)
        self._check_rv(old, lease["metadata"].get("resourceVersion"), name)
        return _json(self._commit("leases", old, leases.lease_update(old, lease)))

    def _delete_lease(self, lease: dict) -> dict | None:
        """Finalizers keep a Lease, marked for deletion; else it goes (None)."""
        meta = lease["metadata"]
        if not meta.get("finalizers"):
            self.store.remove("leases", meta["namespace"], meta["name"])
            return None
        if meta.get("deletionTimestamp"):
            return lease
        return self.store.write("leases", {**lease, "metadata": {
            **meta, "deletionTimestamp": objects.now(), "deletionGracePeriodSeconds": 0}}, lease)

    async def delete_lease(self, request: web.Request, ns: str, name: str) -> web.Response:
        lease = self._get("leases", ns, name)
        opts = await self._delete_options(request)
        self._check_preconditions("leases", lease, opts.get("preconditions"), leases.GROUP)
        kept = self._delete_lease(lease)
        if kept is not None:
            return _json(kept)
        return _json({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": {
            "name": name, "group": leases.GROUP, "kind": "leases", "uid": lease["metadata"]["uid"]}})

    async def delete_lease_collection(self, request: web.Request, ns: str) -> web.Response:
        """deletecollection: every Lease matching the selectors; answers the list of them as deleted."""
        try:
            labels = parse_label_selector(request.query.get("labelSelector"))
            fsel = parse_field_selector(request.query.get("fieldSelector"), LEASE_FIELDS)
        except SelectorError as exc:
            raise ApiError.bad_request(str(exc))
        opts = await self._delete_options(request)
        gone = []
        for lease in self.store.list("leases", ns):
            if labels.matches(lease["metadata"].get("labels")) and fsel.matches(lease):
                self._check_preconditions("leases", lease, opts.get("preconditions"), leases.GROUP)
                gone.append(self._delete_lease(lease) or lease)
        return _json({"kind": "LeaseList", "apiVersion": leases.API_VERSION,
                      "metadata": {"resourceVersion": str(self.store.rv)},
                      "items": [{k: v for k, v in o.items() if k not in ("kind", "apiVersion")} for o in gone]})
