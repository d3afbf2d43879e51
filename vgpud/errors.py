"""Errors the API answers with: each carries its HTTP status and a short
machine-readable code; the message is the human detail."""

from __future__ import annotations

import errno


class ApiError(Exception):
    status = 500
    code = "internal"
    # The connection cannot be trusted for another request (a body cut short).
    close_connection = False

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


class RequestTimeout(ApiError):
    status = 408
    code = "request_timeout"
    close_connection = True


class Conflict(ApiError):
    status = 409
    code = "conflict"


class InUse(Conflict):
    """A delete of a vGPU that processes use (each surface says how to force it)."""

    code = "in_use"


class PayloadTooLarge(ApiError):
    status = 413
    code = "payload_too_large"


class Unprocessable(ApiError):
    status = 422
    code = "invalid"


class ServerError(ApiError):
    status = 500
    code = "internal"


class InsufficientStorage(ApiError):
    """The run dir or the state dir is full: nothing was changed."""

    status = 507
    code = "insufficient_storage"


def storage_error(what: str, exc: OSError) -> ApiError:
    """A failed write as the API answers it: a full file system (or quota)
    is the operator's to fix (507), anything else is ours (500)."""
    detail = f"{what}: {exc.strerror or exc}"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return InsufficientStorage(detail)
    return ServerError(detail)


def for_status(status: int, detail: str) -> ApiError:
    """The ApiError for a status (placement reports 409/422)."""
    for cls in (BadRequest, Forbidden, NotFound, Conflict, PayloadTooLarge, Unprocessable):
        if cls.status == status:
            return cls(detail)
    return ServerError(detail)
