"""The text a failed attempt stores: the exception's own line(s) first, then its traceback.

One string (the attempt's `error`) keeps every reader of the API working, while `agl show` can print the short
message in one-line places and the traceback under the failed attempt.
"""

from __future__ import annotations

import traceback

TRACEBACK_HEAD = "Traceback (most recent call last):"
MAX_CHARS = 20_000  # the API's limit on an attempt's error
_SEPARATOR = "\n\n"


# A text an exception's message holds → a line saying why it happens under agl and what to do; registered by the
# adapters (a framework's own error that agl's way of running it causes)
_HINTS: dict[str, str] = {}


def add_hint(marker: str, hint: str) -> None:
    """After the message of any failure whose message holds `marker`, store `hint` (as its own line)."""
    _HINTS[marker] = hint


def remove_hint(marker: str) -> None:
    _HINTS.pop(marker, None)


def describe(exc: BaseException, limit: int = MAX_CHARS) -> str:
    """`ValueError: bad input` (+ any hint whose marker it holds) + a blank line + the traceback, cut in the middle
    of the traceback (the frames nearest the failure are at its end and are kept) so the whole fits in `limit`
    characters."""
    message = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    hints = [hint for marker, hint in _HINTS.items() if marker in message]
    message = "\n".join([message[: limit // 4], *hints])
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
