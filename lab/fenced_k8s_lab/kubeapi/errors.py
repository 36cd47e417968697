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
    def not_found(cls, resource: str, name: str) -> "ApiError":
        return cls(404, f'{resource} "{name}" not found', details={"name": name, "kind": resource})

    @classmethod
    def already_exists(cls, resource: str, name: str) -> "ApiError":
        return cls(409, f'{resource} "{name}" already exists', "AlreadyExists", {"name": name, "kind": resource})

    @classmethod
    def conflict(cls, resource: str, name: str, why: str) -> "ApiError":
        return cls(
            409, f'Operation cannot be fulfilled on {resource} "{name}": {why}', details={"name": name, "kind": resource}
        )

    @classmethod
    def invalid(cls, kind: str, name: str, problems: list[str]) -> "ApiError":
        causes = [{"reason": "FieldValueInvalid", "message": p} for p in problems]
        msg = f'{kind} "{name}" is invalid: ' + ", ".join(problems)
        return cls(422, msg, "Invalid", {"name": name, "kind": kind.lower() + "s", "causes": causes})

    @classmethod
    def bad_request(cls, message: str) -> "ApiError":
        return cls(400, message)
