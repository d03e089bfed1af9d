"""How values are written into the store's columns: JSON text for structured values, binary for token ids.

Token ids are int32 and log-probs float64 (exact: the bits the backend sent), little-endian, packed with the
stdlib `array` module (agl-core has no numpy). Parsing them from JSON text was most of the time of reading
stored calls back; unpacking a BLOB only creates the Python numbers. A list that does not fit (an id outside
int32, an entry that is not a number) is written as JSON text, as every list was before schema version 4: the
decoders take whichever of the two a row holds.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import Any

import orjson

from agl.common.packed import FLOAT64 as _FLOAT64
from agl.common.packed import INT32 as _INT32
from agl.common.packed import array_bytes, unpack


def dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def loads(text: str | bytes | None) -> Any:
    return None if text is None else orjson.loads(text)


def _pack(code: str, values: Sequence[Any]) -> bytes | str:
    try:
        packed = array(code, values)
    except (OverflowError, TypeError):
        return dumps(values)
    return array_bytes(packed)


def _unpack(code: str, raw: bytes | str) -> list[Any]:
    if type(raw) is not bytes:
        return orjson.loads(raw)  # type: ignore[no-any-return]  # written as JSON text: kept as it was written
    return unpack(code, raw).tolist()


def encode_ids(ids: Sequence[int] | None) -> bytes | str | None:
    return None if ids is None else _pack(_INT32, ids)


def decode_ids(raw: bytes | str | None) -> list[int] | None:
    return None if raw is None else _unpack(_INT32, raw)


def encode_floats(values: Sequence[float] | None) -> bytes | str | None:
    return None if values is None else _pack(_FLOAT64, values)


def decode_floats(raw: bytes | str | None) -> list[float] | None:
    return None if raw is None else _unpack(_FLOAT64, raw)


class TokenIds:
    """Decodes the prompt and response ids of calls read in order, sharing the int objects of a prompt that
    extends the previous call's prompt (+ response): a chat that grew by one turn, as most calls of a multi-turn
    agent do. Copying references to ints already made costs a fraction of making them, and making them was the
    largest part of reading calls back. The lists themselves are never shared."""

    __slots__ = ("_prompt", "_prompt_raw", "_response", "_response_raw")

    def __init__(self) -> None:
        self._prompt_raw = self._response_raw = b""
        self._prompt: list[int] = []
        self._response: list[int] = []

    def decode(
        self, prompt_raw: bytes | str | None, response_raw: bytes | str | None
    ) -> tuple[list[int] | None, list[int] | None]:
        prompt: list[int] | None = None
        response = decode_ids(response_raw)
        if type(prompt_raw) is bytes and self._prompt_raw and prompt_raw.startswith(self._prompt_raw):
            head = len(self._prompt_raw)
            if self._response_raw and prompt_raw.startswith(self._response_raw, head):
                head += len(self._response_raw)
                prompt = self._prompt + self._response + _unpack(_INT32, prompt_raw[head:])
            else:
                prompt = self._prompt + _unpack(_INT32, prompt_raw[head:])
        else:
            prompt = decode_ids(prompt_raw)
        if type(prompt_raw) is bytes and prompt is not None:
            self._prompt_raw, self._prompt = prompt_raw, prompt
            if type(response_raw) is bytes and response is not None:
                self._response_raw, self._response = response_raw, response
            else:
                self._response_raw, self._response = b"", []
        else:
            self._prompt_raw = self._response_raw = b""
        return prompt, response
