"""The text a failed attempt stores: the exception's own line(s) first, then its traceback.

One string (the attempt's `error`) keeps every reader of the API working, while `agl show` can print the short
message in one-line places and the traceback under the failed attempt.
"""

from __future__ import annotations

import traceback

TRACEBACK_HEAD = "Traceback (most recent call last):"
MAX_CHARS = 20_000  # the API's limit on an attempt's error
_SEPARATOR = "\n\n"


def describe(exc: BaseException, limit: int = MAX_CHARS) -> str:
    """`ValueError: bad input` + a blank line + the traceback, cut in the middle of the traceback (the frames
    nearest the failure are at its end and are kept) so the whole fits in `limit` characters."""
    message = "".join(traceback.format_exception_only(type(exc), exc)).strip()[: limit // 4]
    trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
    room = limit - len(message) - len(_SEPARATOR)
    if len(trace) > room:
        cut = "\n  … (traceback cut) …\n"
        head = trace[: room // 4]
        trace = head + cut + trace[len(trace) - (room - len(head) - len(cut)) :]
    return message + _SEPARATOR + trace


def split(error: str) -> tuple[str, str | None]:
    """(message, traceback or None) of a stored error text; texts without a traceback come back whole."""
    at = error.find(_SEPARATOR + TRACEBACK_HEAD)
    if at < 0:
        return error, None
    return error[:at], error[at + len(_SEPARATOR) :]
