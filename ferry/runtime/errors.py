"""ferry's error hierarchy, shared by every service.

Domain code raises these; each service's servicer turns them into gRPC status
codes through one table (`ferry.runtime.grpc_errors`). Messages are built from
structured fields so they say what was wrong and, where it helps, what to do.
"""

from __future__ import annotations


class FerryError(Exception):
    """Base of every error ferry raises on purpose."""

    retriable = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class InvalidArgument(FerryError):
    """A request field is empty, malformed or out of range."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


class NotFound(FerryError):
    """The thing asked for does not exist."""


class AlreadyExists(FerryError):
    """The thing to create exists already."""


class FailedPrecondition(FerryError):
    """The request is well-formed but the state does not allow it now."""


class PermissionDenied(FerryError):
    """The target is not writable (a slave, a read-only topic or broker)."""


class ResourceExhausted(FerryError):
    """A size or count limit was exceeded."""


class Unavailable(FerryError):
    """The service is starting up or shutting down; try again."""

    retriable = True


class ConfigError(FerryError):
    """A configuration value is bad; startup stops naming the key."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"config {key}: {reason}")
        self.key = key
        self.reason = reason


class CorruptFileError(FerryError):
    """A file on disk cannot be parsed and has no usable backup."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class StorageFault(FerryError):
    """A write or sync of the store failed in a way the broker cannot account
    for (not a full disk): what is on disk is no longer known. The broker stops
    (fail-stop) and recovery runs at the next start."""

    def __init__(self, operation: str, path: str, error: OSError) -> None:
        errno_name = _errno_name(error.errno)
        super().__init__(f"{operation} of {path} failed: {errno_name} ({error.strerror or error})")
        self.operation = operation
        self.path = path
        self.errno = error.errno


def _errno_name(number: int | None) -> str:
    import errno

    return errno.errorcode.get(number or 0, f"errno {number}")
