# SPDX-License-Identifier: MIT
"""Exceptions raised by the dormant package.

Every failure of a libdormant call becomes a DormantError subclass chosen by
the negative errno the call returned. The exception carries that errno, the
library's own message (dormant_last_error()) and, for a failed sleep or wake,
the report of what the transition did (a dict shaped like the HTTP report).
"""
import errno as _errno
from typing import Any, Dict, Optional


class DormantError(Exception):
    """A libdormant call failed.

    Attributes:
        errno: the positive errno (EBUSY, ENOMEM, ...), or 0 when none applies.
        message: the library's message (dormant_last_error()).
        report: for sleep and wake, the transition report dict; else None.
    """

    def __init__(self, message: str, errno: int = 0,
                 report: Optional[Dict[str, Any]] = None) -> None:
        super().__init__(message)
        self.errno = errno
        self.message = message
        self.report = report

    def __str__(self):
        name = _errno.errorcode.get(self.errno)
        return f"{self.message} ({name})" if name else self.message


class BusyError(DormantError):
    """EBUSY: another sleep or wake runs, the guard timed out, or the tag is
    not awake (HTTP 409)."""


class OutOfMemoryError(DormantError):
    """ENOMEM: device (or host) memory could not be had. A failed wake leaves
    its tags asleep with their host copies intact: retry it once the memory is
    free (HTTP 503)."""


class UnknownTagError(DormantError, LookupError):
    """ENOENT: a named tag does not exist (HTTP 404)."""


class InvalidArgumentError(DormantError, ValueError):
    """EINVAL: a bad tag name, policy, pointer or option."""


class CancelledError(DormantError):
    """ECANCELED: a before-sleep or before-wake hook refused the transition.
    When the hook was a Python function that raised, the exception is chained
    as __cause__ (for transitions started from Python on this thread)."""


class StepTimeoutError(DormantError):
    """ETIMEDOUT: a training step waited longer than its timeout for the
    memory to wake."""


class DeviceError(DormantError):
    """EIO: the device failed; the manager rolled back what it could."""


class NoDeviceError(DormantError):
    """ENODEV: no usable device (e.g. backend "cuda" without a GPU)."""


class LimitError(DormantError):
    """ENOSPC: a table is full (tags, hooks)."""


class AddressInUseError(DormantError):
    """EADDRINUSE: the server's address is taken."""


class PermissionDeniedError(DormantError):
    """EACCES: the server may not listen there."""


class UnsupportedError(DormantError):
    """ENOSYS: the loaded libdormant lacks a function this package needs."""


class LibraryNotFoundError(DormantError):
    """libdormant.so could not be found or loaded. The message lists every
    place that was tried and why each failed."""


_BY_ERRNO = {
    _errno.EBUSY: BusyError,
    _errno.ENOMEM: OutOfMemoryError,
    _errno.ENOENT: UnknownTagError,
    _errno.EINVAL: InvalidArgumentError,
    _errno.ECANCELED: CancelledError,
    _errno.ETIMEDOUT: StepTimeoutError,
    _errno.EIO: DeviceError,
    _errno.ENODEV: NoDeviceError,
    _errno.ENOSPC: LimitError,
    _errno.EADDRINUSE: AddressInUseError,
    _errno.EACCES: PermissionDeniedError,
    _errno.ENOSYS: UnsupportedError,
}


def error_from(result, message, report=None):
    """The exception for a negative errno result and the library's message."""
    code = -result if result < 0 else result
    cls = _BY_ERRNO.get(code, DormantError)
    if not message:
        message = _errno.errorcode.get(code, f"error {code}")
    return cls(message, code, report)
