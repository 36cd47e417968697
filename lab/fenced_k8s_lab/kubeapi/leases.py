"""coordination.k8s.io/v1 Lease semantics, as kube-apiserver v1.36 applies them. Pure.

What a Lease writer can get wrong, and what the real server answers (checked by
tests/conformance/test_leases.py against both):
- a body that does not decode into a Lease (a renewTime not in MicroTime's layout -- exactly six
  fraction digits and a zone, `2026-12-06T03:00:00.123456Z` -- a string duration, a float): 400 on
  create/update, 422 on a patch (kube decodes the patched document);
- validation (422): name a DNS subdomain, label and annotation syntax, annotations <= 256 KiB,
  leaseDurationSeconds > 0, leaseTransitions >= 0.
Times are stored as kube serializes them: UTC, six fraction digits, "Z". Unknown spec fields are
dropped, and so are `strategy` and `preferredHolder` (the CoordinatedLeaderElection feature gate
is off by default). Leases have no status and no metadata.generation.
"""

from __future__ import annotations

import datetime as _dt
import re

from .errors import ApiError
from .objects import _keep_server_meta, _meta_problems, _metadata, new_metadata

__all__ = ["GROUP", "API_VERSION", "LeaseDecodeError", "decode", "prepare_lease", "lease_update", "micro_time"]

GROUP = "coordination.k8s.io"
API_VERSION = f"{GROUP}/v1"
_MICRO = re.compile(r"^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})\.(\d{6})(Z|[+-]\d{2}:\d{2})$")
_INTS = ("leaseDurationSeconds", "leaseTransitions")
_TIMES = ("acquireTime", "renewTime")
_STRINGS = ("holderIdentity",)
_GATED = ("strategy", "preferredHolder")  # CoordinatedLeaderElection: off, so dropped


class LeaseDecodeError(ValueError):
    """The document does not decode into a Lease (400 on create/update, 422 on patch)."""


def micro_time(value: str) -> str:
    """A MicroTime as kube stores it (UTC, `.ffffffZ`); LeaseDecodeError unless Go's
    time.Parse("2006-01-02T15:04:05.000000Z07:00") accepts it."""
    m = _MICRO.match(value)
    try:
        if not m:
            raise ValueError
        zone = m.group(8)
        tz = _dt.timezone.utc if zone == "Z" else _dt.timezone(
            (1 if zone[0] == "+" else -1) * _dt.timedelta(hours=int(zone[1:3]), minutes=int(zone[4:6])))
        t = _dt.datetime(*(int(m.group(i)) for i in range(1, 7)), int(m.group(7)), tzinfo=tz)
    except ValueError:
        raise LeaseDecodeError(f'parsing time "{value}" as "2006-01-02T15:04:05.000000Z07:00": cannot parse')
    return t.astimezone(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def decode(body: object) -> dict:
    """The Lease a JSON document decodes to: typed spec fields checked, times normalized, unknown
    and gated spec fields dropped."""
    if not isinstance(body, dict):
        raise LeaseDecodeError("json: cannot unmarshal into Go value of type v1.Lease")
    if body.get("kind") not in (None, "", "Lease") or body.get("apiVersion") not in (None, "", API_VERSION):
        raise LeaseDecodeError(f'{body.get("kind")} in version "{body.get("apiVersion")}" cannot be handled as a '
                               f'Lease')
    try:
        meta = _metadata(body)
    except ApiError as exc:
        raise LeaseDecodeError(exc.body["message"])
    for key in ("labels", "annotations"):
        if any(not isinstance(v, str) for v in (meta.get(key) or {}).values()):
            raise LeaseDecodeError(f"json: cannot unmarshal into Go struct field ObjectMeta.metadata.{key} of "
                                   f"type string")
    spec = body.get("spec")
    if spec is None:
        spec = {}
    if not isinstance(spec, dict):
        raise LeaseDecodeError("json: cannot unmarshal into Go struct field Lease.spec of type v1.LeaseSpec")
    out: dict = {}
    for key, value in spec.items():
        if value is None or key in _GATED and isinstance(value, str):
            continue
        if key in _INTS:
            if isinstance(value, bool) or not isinstance(value, int) or not -2**31 <= value < 2**31:
                raise LeaseDecodeError(f"json: cannot unmarshal {value!r} into Go struct field "
                                       f"LeaseSpec.spec.{key} of type int32")
            out[key] = value
        elif key in _TIMES or key in _STRINGS or key in _GATED:
            if not isinstance(value, str):
                raise LeaseDecodeError(f"json: cannot unmarshal {type(value).__name__} into Go struct field "
                                       f"LeaseSpec.spec.{key} of type string")
            out[key] = micro_time(value) if key in _TIMES else value
    return {**body, "metadata": meta, "spec": out}


def _problems(lease: dict) -> list[str]:
    problems = _meta_problems(lease["metadata"], True)
    spec = lease["spec"]
    if spec.get("leaseDurationSeconds") is not None and spec["leaseDurationSeconds"] <= 0:
        problems.append(f"spec.leaseDurationSeconds: Invalid value: {spec['leaseDurationSeconds']}: "
                        f"must be greater than 0")
    if spec.get("leaseTransitions") is not None and spec["leaseTransitions"] < 0:
        problems.append(f"spec.leaseTransitions: Invalid value: {spec['leaseTransitions']}: "
                        f"must be greater than or equal to 0")
    return problems


def prepare_lease(lease: dict, namespace: str, taken) -> dict:
    """A new Lease from a decoded create body (ApiError 400/422)."""
    meta = new_metadata(lease, namespace, taken)
    problems = _problems({"metadata": meta, "spec": lease["spec"]})
    if problems:
        raise ApiError.invalid("Lease", meta.get("name", ""), problems, GROUP)
    return {"kind": "Lease", "apiVersion": API_VERSION, "metadata": meta, "spec": lease["spec"]}


def lease_update(old: dict, lease: dict) -> dict:
    """The Lease stored by an update or patch (decoded): server metadata kept, everything else taken."""
    meta = _keep_server_meta(old, lease)
    out = {"kind": "Lease", "apiVersion": API_VERSION, "metadata": meta, "spec": lease["spec"]}
    problems = _problems(out)
    if problems:
        raise ApiError.invalid("Lease", old["metadata"]["name"], problems, GROUP)
    return out
