"""Domain errors: each carries its gRPC status code and an ErrorInfo reason."""

from __future__ import annotations

from collections.abc import Mapping

import grpc

ERROR_DOMAIN = "footnote"


class FootnoteError(Exception):
    """A failure the client should see; its message is written for the client, never internal."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    reason: str = "INTERNAL"

    def __init__(
        self, message: str, *, reason: str | None = None, metadata: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        if reason is not None:
            self.reason = reason
        self.metadata: dict[str, str] = dict(metadata or {})


class InvalidArgument(FootnoteError):
    code = grpc.StatusCode.INVALID_ARGUMENT
    reason = "INVALID_ARGUMENT"

    def __init__(self, field: str, message: str, *, reason: str | None = None) -> None:
        super().__init__(message, reason=reason, metadata={"field": field})
        self.field = field


class NotFound(FootnoteError):
    code = grpc.StatusCode.NOT_FOUND
    reason = "NOT_FOUND"

    def __init__(self, resource: str, resource_id: str) -> None:
        # The same text for a missing id and another tenant's id, so neither leaks existence.
        super().__init__(
            f"{resource} {resource_id!r} was not found",
            metadata={"resource": resource, "id": resource_id},
        )


class Unauthenticated(FootnoteError):
    code = grpc.StatusCode.UNAUTHENTICATED
    reason = "UNAUTHENTICATED"


class AlreadyExists(FootnoteError):
    code = grpc.StatusCode.ALREADY_EXISTS
    reason = "ALREADY_EXISTS"


class Aborted(FootnoteError):
    code = grpc.StatusCode.ABORTED
    reason = "ABORTED"


class FailedPrecondition(FootnoteError):
    code = grpc.StatusCode.FAILED_PRECONDITION
    reason = "FAILED_PRECONDITION"


class ResourceExhausted(FootnoteError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    reason = "RESOURCE_EXHAUSTED"


class Unavailable(FootnoteError):
    code = grpc.StatusCode.UNAVAILABLE
    reason = "UNAVAILABLE"


class Unimplemented(FootnoteError):
    code = grpc.StatusCode.UNIMPLEMENTED
    reason = "UNIMPLEMENTED"
