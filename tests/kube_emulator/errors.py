"""Kubernetes ``Status`` failures with the real API server's codes, reasons and messages."""

from __future__ import annotations

from tests.kube_emulator.objects import JSON, ResourceType

REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


def status_body(
    code: int, message: str, reason: str | None = None, details: JSON | None = None
) -> JSON:
    """A Kubernetes ``Status`` failure object."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason or REASONS.get(code, "Unknown"),
        "details": details or {},
        "code": code,
    }


class ApiFailure(Exception):
    """Raised inside the emulator to answer with a ``Status`` (never reaches clients)."""

    def __init__(
        self, code: int, message: str, reason: str | None = None, details: JSON | None = None
    ) -> None:
        super().__init__(message)
        self.body = status_body(code, message, reason, details)
        self.code = code


def details_of(rtype: ResourceType, name: str | None, kind: str | None = None) -> JSON:
    """The ``details`` of a Status about one object (or a collection when ``name`` is None)."""
    details: JSON = {"group": rtype.group, "kind": kind or rtype.plural}
    if name:
        details["name"] = name
    return details


def not_found(rtype: ResourceType, name: str) -> ApiFailure:
    return ApiFailure(404, f'{rtype.resource} "{name}" not found', details=details_of(rtype, name))


def conflict(rtype: ResourceType, name: str, why: str | None = None) -> ApiFailure:
    why = why or (
        "the object has been modified; please apply your changes to the latest version "
        "and try again"
    )
    return ApiFailure(
        409,
        f'Operation cannot be fulfilled on {rtype.resource} "{name}": {why}',
        "Conflict",
        details_of(rtype, name),
    )


def invalid(rtype: ResourceType, name: str, field_path: str, why: str) -> ApiFailure:
    qualified = f"{rtype.kind}.{rtype.group}" if rtype.group else rtype.kind
    details = details_of(rtype, name, rtype.kind)
    details["causes"] = [{"reason": "FieldValueInvalid", "message": why, "field": field_path}]
    message = f'{qualified} "{name}" is invalid: {field_path}: {why}'
    return ApiFailure(422, message, None, details)
