"""Token ids and log-probs as packed arrays: int32 and float64, little-endian in bytes.

The one binary form of both, shared by the store's BLOB columns (agl.store.codec) and the training read's wire
format (agl.trainable). A packed array is copied as a block; a list holds one Python object per number, which
is what made reading calls back slow.
"""

from __future__ import annotations

import sys
from array import array
from typing import Any, Final

import orjson

INT32 = next(code for code in "ilh" if array(code).itemsize == 4)
FLOAT64: Final = "d"
BIG_ENDIAN = sys.byteorder == "big"


def ids_array(raw: bytes | str) -> array[int]:
    """Stored ids as a packed int32 array, never as Python ints: what the training read hands on (a BLOB is
    copied as it is; a row written as JSON text before schema 4 is parsed)."""
    if type(raw) is not bytes:
        return array(INT32, orjson.loads(raw))
    values = array(INT32, raw)
    if BIG_ENDIAN:
        values.byteswap()
    return values


def floats_array(raw: bytes | str) -> array[float]:
    """Stored log-probs as a packed float64 array (see `ids_array`)."""
    if type(raw) is not bytes:
        return array(FLOAT64, orjson.loads(raw))
    values = array(FLOAT64, raw)
    if BIG_ENDIAN:
        values.byteswap()
    return values


def array_bytes(values: array[Any]) -> bytes:
    """The little-endian bytes of a packed array: how BLOBs and the training read's wire format hold them."""
    if BIG_ENDIAN:
        values = array(values.typecode, values)
        values.byteswap()
    return values.tobytes()
