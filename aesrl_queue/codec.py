"""Bytes in and out of Redis: msgpack maps whose numpy arrays travel as dtype, shape and raw bytes.

Nothing is pickled, and every decoder validates what it reads (type, dtype, shape, finiteness).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgpack
import numpy as np

# Ext type code for an ndarray: payload is msgpack [dtype-str, shape-list, raw little-endian bytes].
_EXT_NDARRAY = 1
ALLOWED_DTYPES = ("<f4", "<f8", "<i4", "<i8", "|u1", "|b1", "<u8")
# Upper bound of a single decoded array, so a corrupt shape cannot ask for terabytes.
MAX_ARRAY_BYTES = 1 << 30


class CodecError(ValueError):
    """A stored value is malformed, of the wrong kind, or not finite."""


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        arr = np.ascontiguousarray(obj).reshape(obj.shape)  # ascontiguousarray makes 0-d arrays 1-d
        dt = arr.dtype.newbyteorder("<") if arr.dtype.byteorder == ">" else arr.dtype
        arr = arr.astype(dt, copy=False)
        if dt.str not in ALLOWED_DTYPES:
            raise CodecError(f"cannot encode arrays of dtype {arr.dtype}; allowed: {', '.join(ALLOWED_DTYPES)}")
        payload = msgpack.packb([dt.str, list(arr.shape), arr.tobytes()], use_bin_type=True)
        return msgpack.ExtType(_EXT_NDARRAY, payload)
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, tuple):
        return list(obj)
    raise CodecError(f"cannot encode a value of type {type(obj).__name__}")


def json_default(obj: Any) -> Any:
    """`json.dumps(..., default=json_default)`: numpy scalars as Python numbers, arrays as lists, anything
    else JSON cannot write as its text (run folders, reports and benchmark results stay readable)."""
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return str(obj)


def _ext_hook(code: int, data: bytes) -> Any:
    if code != _EXT_NDARRAY:
        raise CodecError(f"unknown msgpack extension type {code}")
    try:
        dtype, shape, raw = msgpack.unpackb(data, raw=False)
    except Exception as exc:  # malformed payloads raise many kinds of errors
        raise CodecError(f"malformed array payload: {exc}") from None
    if dtype not in ALLOWED_DTYPES:
        raise CodecError(f"array dtype {dtype!r} not allowed; allowed: {', '.join(ALLOWED_DTYPES)}")
    if not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
        raise CodecError(f"array shape {shape!r} is not a list of non-negative ints")
    expected = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    if expected > MAX_ARRAY_BYTES:
        raise CodecError(f"array of shape {shape} is larger than the {MAX_ARRAY_BYTES} byte limit")
    if not isinstance(raw, bytes | bytearray):
        raise CodecError(f"array data should be bytes, got {type(raw).__name__}")
    if len(raw) != expected:
        raise CodecError(f"array of dtype {dtype} and shape {shape} needs {expected} bytes, got {len(raw)}")
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()  # writable, owns its memory


def pack(obj: Mapping[str, Any] | Any) -> bytes:
    """msgpack bytes of a map (or list/scalar) that may hold numpy arrays."""
    return msgpack.packb(obj, default=_default, use_bin_type=True)


def looks_pickled(blob: bytes) -> bool:
    """True for a pickle (protocol 2+): PROTO opcode and version first, STOP opcode last.

    The STOP check matters for raw float blobs: about 1 in 16 000 float32 arrays start with the
    bytes 0x80 0x02..0x05 (e.g. 0.50003815), and such a valid μ must not be called a pickle.
    """
    return len(blob) >= 3 and blob[0] == 0x80 and 2 <= blob[1] <= 5 and blob[-1] == 0x2E


def _checked_bytes(blob: Any, what: str) -> bytes:
    """The bytes of a stored value, refusing a missing value, a non-bytes value and a pickle."""
    if blob is None:
        raise CodecError(f"{what} is missing")
    if not isinstance(blob, bytes | bytearray | memoryview):
        raise CodecError(f"{what} is a {type(blob).__name__}, expected bytes")
    blob = bytes(blob)
    if looks_pickled(blob):
        raise CodecError(f"{what} holds a pickle; this project never unpickles: rejected")
    return blob


def unpack(blob: bytes | None, *, what: str = "value", expect_map: bool = True) -> Any:
    """Decode bytes written by `pack`; CodecError names `what` and the problem."""
    blob = _checked_bytes(blob, what)
    try:
        obj = msgpack.unpackb(blob, ext_hook=_ext_hook, raw=False, strict_map_key=False)
    except CodecError as exc:
        raise CodecError(f"{what}: {exc}") from None
    except Exception as exc:  # ExtraData, FormatError, OutOfData, UnicodeDecodeError, ...
        raise CodecError(f"{what} is not a valid msgpack value ({type(exc).__name__}: {exc})") from None
    if expect_map and not isinstance(obj, dict):
        raise CodecError(f"{what} should be a msgpack map, got {type(obj).__name__}")
    return obj


def encode_array(arr: np.ndarray, dtype: str = "<f4") -> bytes:
    """Raw little-endian bytes of a 1-D array (the `mu`/`var`/weights blob format)."""
    return np.ascontiguousarray(arr, dtype=np.dtype(dtype)).tobytes()


def array_view(arr: np.ndarray, dtype: str = "<f4") -> memoryview | bytes:
    """The bytes of `encode_array` without copying them when `arr` already has that layout.

    For arguments of Redis commands: redis-py sends a large memoryview as it is. The caller must
    not change `arr` until the command has been sent."""
    out = np.ascontiguousarray(arr, dtype=np.dtype(dtype))
    if out.ndim != 1:
        return out.tobytes()
    return memoryview(out).cast("B")


def decode_array(
    blob: bytes | None,
    *,
    dtype: str = "<f4",
    size: int | None = None,
    finite: bool = True,
    what: str = "array",
) -> np.ndarray:
    """A writable 1-D array from raw bytes, checked for length and (optionally) finiteness."""
    blob = _checked_bytes(blob, what)
    item = np.dtype(dtype).itemsize
    if len(blob) % item:
        raise CodecError(f"{what} has {len(blob)} bytes, not a multiple of {item} ({dtype})")
    n = len(blob) // item
    if size is not None and n != size:
        raise CodecError(f"{what} has {n} values, expected {size}")
    arr = np.frombuffer(blob, dtype=dtype).copy()
    if finite and not np.all(np.isfinite(arr)):
        raise CodecError(f"{what} holds {int(np.sum(~np.isfinite(arr)))} non-finite values")
    return arr


def check_array(arr: Any, *, shape: tuple[int, ...] | None = None, finite: bool = True, what: str = "array") -> np.ndarray:
    """Validate a decoded array's type, shape and finiteness."""
    if not isinstance(arr, np.ndarray):
        raise CodecError(f"{what} should be an array, got {type(arr).__name__}")
    if shape is not None and tuple(arr.shape) != tuple(shape):
        raise CodecError(f"{what} has shape {tuple(arr.shape)}, expected {tuple(shape)}")
    if finite and arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
        raise CodecError(f"{what} holds non-finite values")
    return arr
