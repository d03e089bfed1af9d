"""Errors the store raises; the server maps them to HTTP status codes."""


class StoreError(Exception):
    """Base class: the message names what is wrong and is shown to the caller as is."""


class NotFoundError(StoreError):
    """An id that the store does not hold (HTTP 404)."""


class ConflictError(StoreError):
    """A request that contradicts what is stored, e.g. a report from a superseded attempt (HTTP 409)."""


class StoreUnavailable(StoreError):
    """The store cannot take writes now (its writer thread has stopped): HTTP 503, and the server exits."""
