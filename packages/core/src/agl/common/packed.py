"""Token ids and log-probs as packed arrays: int32 and float64, little-endian in bytes.

The one binary form of both, shared by the store's BLOB columns (agl.store.codec) and the training read's wire
format (agl.common.trainable). A packed array is copied as a block; a list holds one Python object per number, which
is what made reading calls back slow.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Iterable
from typing import Any, Final

import orjson

INT32 = next(code for code in "ilh" if array(code).itemsize == 4)
FLOAT64: Final = "d"
BIG_ENDIAN = sys.byteorder == "big"


def unpack(code: str, raw: bytes | str) -> array[Any]:
    """A BLOB (little-endian bytes) as a packed array of `code`; JSON text (rows written before schema 4) is
    parsed. Raises OverflowError or TypeError for JSON values that `code` cannot hold."""
    if type(raw) is not bytes:
        return array(code, orjson.loads(raw))
    values = array(code, raw)
    if BIG_ENDIAN:
        values.byteswap()
    return values


def ids_array(raw: bytes | str) -> array[int]:
    """Stored ids as a packed int32 array, never as Python ints: what the training read hands on."""
    return unpack(INT32, raw)


def floats_array(raw: bytes | str) -> array[float]:
    """Stored log-probs as a packed float64 array."""
    return unpack(FLOAT64, raw)


def concat(code: str, *parts: Iterable[Any]) -> array[Any]:
    """One packed array of `code` holding these sequences end to end (arrays are copied as blocks)."""
    out = array(code)
    for part in parts:
        out.extend(part)
    return out


def array_bytes(values: array[Any]) -> bytes:
    """The little-endian bytes of a packed array: how BLOBs and the training read's wire format hold them."""
    if BIG_ENDIAN:
        values = array(values.typecode, values)
        values.byteswap()
    return values.tobytes()
