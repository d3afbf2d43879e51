"""Errors the API answers with: each carries its HTTP status and a short
machine-readable code; the message is the human detail."""

from __future__ import annotations


class ApiError(Exception):
    status = 500
    code = "internal"

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class BadRequest(ApiError):
    status = 400
    code = "bad_request"


class Forbidden(ApiError):
    status = 403
    code = "forbidden"


class NotFound(ApiError):
    status = 404
    code = "not_found"


class Conflict(ApiError):
    status = 409
    code = "conflict"


class PayloadTooLarge(ApiError):
    status = 413
    code = "payload_too_large"


class Unprocessable(ApiError):
    status = 422
    code = "invalid"


class ServerError(ApiError):
    status = 500
    code = "internal"


def for_status(status: int, detail: str) -> ApiError:
    """The ApiError for a status (placement reports 409/422)."""
    for cls in (BadRequest, Forbidden, NotFound, Conflict, PayloadTooLarge, Unprocessable):
        if cls.status == status:
            return cls(detail)
    return ServerError(detail)
