"""kube `Status` error bodies, so clients see the same code/reason/message shapes as a real server."""

from __future__ import annotations

__all__ = ["ApiError", "status_body", "REASONS"]

REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def status_body(code: int, message: str, reason: str | None = None, details: dict | None = None) -> dict:
    body = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason or REASONS.get(code, ""),
        "code": code,
    }
    if details:
        body["details"] = details
    return body


class ApiError(Exception):
    """Raised by handlers; the middleware turns it into a Status response."""

    def __init__(self, code: int, message: str, reason: str | None = None, details: dict | None = None):
        super().__init__(message)
        self.code = code
        self.body = status_body(code, message, reason, details)

    @classmethod
    def not_found(cls, resource: str, name: str, group: str = "") -> "ApiError":
        return cls(404, f'{_qualified(resource, group)} "{name}" not found', details=_details(name, resource, group))

    @classmethod
    def already_exists(cls, resource: str, name: str, group: str = "") -> "ApiError":
        return cls(409, f'{_qualified(resource, group)} "{name}" already exists', "AlreadyExists",
                   _details(name, resource, group))

    @classmethod
    def conflict(cls, resource: str, name: str, why: str, group: str = "") -> "ApiError":
        return cls(409, f'Operation cannot be fulfilled on {_qualified(resource, group)} "{name}": {why}',
                   details=_details(name, resource, group))

    @classmethod
    def invalid(cls, kind: str, name: str, problems: list[str], group: str = "") -> "ApiError":
        """422 Invalid; each problem reads "field.path: what is wrong" (as kube's field.Error)."""
        causes = []
        for p in problems:
            field, sep, what = p.partition(": ")
            causes.append({"reason": "FieldValueInvalid", "message": what, "field": field} if sep and " " not in field
                          else {"reason": "FieldValueInvalid", "message": p})
        listed = problems[0] if len(problems) == 1 else "[" + ", ".join(problems) + "]"
        msg = f'{_qualified(kind, group)} "{name}" is invalid: {listed}'
        details = {"name": name, "kind": kind if group else kind.lower() + "s", "causes": causes}
        if not name:
            del details["name"]
        if group:
            details["group"] = group
        return cls(422, msg, "Invalid", details)

    @classmethod
    def bad_request(cls, message: str) -> "ApiError":
        return cls(400, message)


def _qualified(resource: str, group: str) -> str:
    """kube's GroupResource.String(): "pods", "leases.coordination.k8s.io"."""
    return f"{resource}.{group}" if group else resource


def _details(name: str, resource: str, group: str) -> dict:
    return {"name": name, "group": group, "kind": resource} if group else {"name": name, "kind": resource}
