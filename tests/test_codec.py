"""The msgpack codec: exact round trips, and clear rejections of everything this project did not write."""

from __future__ import annotations

import math
import pickle

import msgpack
import numpy as np
import pytest

from aesrl_queue import codec
from aesrl_queue.codec import CodecError, decode_array, encode_array, looks_pickled, pack, unpack


def _ext_map(dtype, shape, raw) -> bytes:
    """A map {"a": <ndarray ext>} with a hand-made payload, as a corrupt writer could produce."""
    payload = msgpack.packb([dtype, shape, raw], use_bin_type=True)
    return msgpack.packb({"a": msgpack.ExtType(1, payload)}, use_bin_type=True)


# -- round trips ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "arr",
    [
        np.arange(7, dtype=np.float32) / 3,
        np.linspace(-1, 1, 12, dtype=np.float64).reshape(3, 4),
        np.arange(24, dtype=np.int64).reshape(2, 3, 4) - 11,
        np.arange(-5, 5, dtype=np.int32),
        np.array([True, False, True]),
        np.arange(6, dtype=np.uint8).reshape(2, 3),
        np.zeros((0, 3), dtype=np.float32),
        np.array(2.5, dtype=np.float32),  # 0-d, as torch's Adam 'step' becomes in a checkpoint
        np.array([np.finfo(np.float32).max, np.finfo(np.float32).tiny, -0.0], dtype=np.float32),
    ],
    ids=["f4-1d", "f8-2d", "i8-3d", "i4", "bool", "u1-2d", "empty-rows", "f4-0d", "f4-extremes"],
)
def test_array_round_trip_keeps_dtype_shape_and_values(arr: np.ndarray) -> None:
    out = unpack(pack({"x": arr}))["x"]
    assert isinstance(out, np.ndarray)
    assert out.dtype == arr.dtype
    assert out.shape == arr.shape
    np.testing.assert_array_equal(out, arr)


def test_round_trip_of_nested_maps_and_scalars() -> None:
    value = {
        "version": 7,
        "f": 1.25,
        "neg": -3,
        "big": 2**62,
        "name": "HalfCheetah-v5",
        "blob": b"\x00\x01raw",
        "none": None,
        "flag": True,
        "list": [1, 2.5, "x"],
        "nested": {"mu": np.ones(3, np.float32), "inner": {"w": np.eye(2), "k": [np.arange(2)]}},
        0: {"int": "keys"},  # torch optimizer state dicts have int keys
    }
    out = unpack(pack(value))
    assert out["version"] == 7 and out["f"] == 1.25 and out["neg"] == -3 and out["big"] == 2**62
    assert out["name"] == "HalfCheetah-v5" and out["blob"] == b"\x00\x01raw"
    assert out["none"] is None and out["flag"] is True
    assert out["list"] == [1, 2.5, "x"]
    np.testing.assert_array_equal(out["nested"]["mu"], np.ones(3, np.float32))
    np.testing.assert_array_equal(out["nested"]["inner"]["w"], np.eye(2))
    assert out["nested"]["inner"]["w"].dtype == np.float64
    np.testing.assert_array_equal(out["nested"]["inner"]["k"][0], np.arange(2))
    assert out[0] == {"int": "keys"}


def test_numpy_scalars_tuples_views_and_big_endian_are_encoded_by_value() -> None:
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    value = {
        "s": np.float32(1.5), "i": np.int64(4), "t": (1, 2),
        "view": base.T,  # not C-contiguous
        "be": np.arange(3, dtype=">f4") + 0.5,  # big-endian input
    }
    out = unpack(pack(value))
    assert out["s"] == 1.5 and out["i"] == 4 and out["t"] == [1, 2]
    np.testing.assert_array_equal(out["view"], base.T)
    assert out["be"].dtype == np.dtype("<f4")
    np.testing.assert_array_equal(out["be"], [0.5, 1.5, 2.5])


def test_decoded_arrays_are_writable_and_own_their_memory() -> None:
    out = unpack(pack({"a": np.zeros(4, np.float32)}))["a"]
    out[0] = 3.0  # a frombuffer view would raise "assignment destination is read-only"
    assert out[0] == 3.0 and out.flags.owndata
    arr = decode_array(encode_array(np.ones(5)), size=5)
    arr += 1
    assert np.all(arr == 2.0)


def test_pack_refuses_values_it_cannot_write() -> None:
    with pytest.raises(CodecError, match="float16"):
        pack({"a": np.zeros(2, np.float16)})
    with pytest.raises(CodecError, match="object"):
        pack({"a": np.array([object()], dtype=object)})
    with pytest.raises(CodecError, match="set"):
        pack({"a": {1, 2}})


# -- unpack rejects what this project did not write --------------------------------------------------
def test_unpack_rejects_a_pickle_and_says_so() -> None:
    for protocol in (2, 4, 5):
        blob = pickle.dumps({"mu": [1.0, 2.0], "version": 3}, protocol=protocol)
        with pytest.raises(CodecError, match="pickle") as err:
            unpack(blob, what="dist:3 mu")
        assert "dist:3 mu" in str(err.value)
    assert isinstance(err.value, ValueError)


def test_unpack_rejects_a_truncated_blob() -> None:
    blob = pack({"mu": np.arange(100, dtype=np.float32), "version": 1})
    for cut in (1, len(blob) // 2, len(blob) - 1):
        with pytest.raises(CodecError, match="critic weights"):
            unpack(blob[:cut], what="critic weights")


def test_unpack_rejects_garbage_bytes() -> None:
    rng = np.random.default_rng(0)
    for blob in (b"hello world", b"\xc1\xc1\xc1", rng.bytes(64), b""):
        with pytest.raises(CodecError, match="not a valid msgpack value"):
            unpack(blob)


def test_unpack_rejects_a_list_where_a_map_is_expected() -> None:
    blob = pack([1, 2, 3])
    with pytest.raises(CodecError, match="should be a msgpack map, got list"):
        unpack(blob, what="config")
    assert unpack(blob, expect_map=False) == [1, 2, 3]


def test_unpack_rejects_missing_and_non_bytes() -> None:
    with pytest.raises(CodecError, match="config is missing"):
        unpack(None, what="config")
    with pytest.raises(CodecError, match="expected bytes"):
        unpack("a string", what="config")  # type: ignore[arg-type]


def test_unpack_rejects_an_array_whose_bytes_do_not_match_its_shape() -> None:
    with pytest.raises(CodecError, match=r"needs 24 bytes, got 20"):
        unpack(_ext_map("<f4", [2, 3], b"\x00" * 20))
    with pytest.raises(CodecError, match=r"needs 24 bytes, got 28"):
        unpack(_ext_map("<f4", [2, 3], b"\x00" * 28))
    with pytest.raises(CodecError, match="should be bytes"):
        unpack(_ext_map("<f4", [1], 5))


def test_unpack_rejects_a_disallowed_dtype() -> None:
    for dtype in ("<f2", "|O", ">f4", "<U3"):
        with pytest.raises(CodecError, match="not allowed") as err:
            unpack(_ext_map(dtype, [1], b"\x00" * 8))
        assert repr(dtype) in str(err.value)


def test_unpack_rejects_bad_shapes_and_extension_codes() -> None:
    with pytest.raises(CodecError, match="non-negative ints"):
        unpack(_ext_map("<f4", [-1], b""))
    with pytest.raises(CodecError, match="non-negative ints"):
        unpack(_ext_map("<f4", "3", b"\x00" * 12))
    with pytest.raises(CodecError, match="byte limit"):
        unpack(_ext_map("<f8", [1 << 20, 1 << 10], b""))
    with pytest.raises(CodecError, match="malformed array payload"):
        unpack(msgpack.packb({"a": msgpack.ExtType(1, b"\xc1")}))
    with pytest.raises(CodecError, match="extension type 9"):
        unpack(msgpack.packb({"a": msgpack.ExtType(9, b"")}))


# -- raw array blobs ----------------------------------------------------------------------------------
def test_decode_array_round_trip_and_length_check() -> None:
    x = np.linspace(-2, 2, 9)
    out = decode_array(encode_array(x), size=9)
    assert out.dtype == np.float32 and out.shape == (9,)
    np.testing.assert_allclose(out, x, rtol=1e-7)
    with pytest.raises(CodecError, match=r"mu has 9 values, expected 10"):
        decode_array(encode_array(x), size=10, what="mu")
    with pytest.raises(CodecError, match=r"has 35 bytes, not a multiple of 4"):
        decode_array(encode_array(x)[:-1], size=9)
    with pytest.raises(CodecError, match="var is missing"):
        decode_array(None, what="var")
    d = decode_array(encode_array(x, dtype="<f8"), dtype="<f8", size=9)
    np.testing.assert_array_equal(d, x)


def test_decode_array_rejects_non_finite_values_and_names_the_count() -> None:
    x = np.array([1.0, np.nan, 2.0, np.inf, -np.inf], dtype=np.float32)
    with pytest.raises(CodecError, match=r"ind:j1 holds 3 non-finite values"):
        decode_array(encode_array(x), size=5, what="ind:j1")
    out = decode_array(encode_array(x), size=5, finite=False)
    assert np.isnan(out[1]) and out[3] == np.inf


def test_decode_array_rejects_pickles() -> None:
    for obj in (np.zeros(4, np.float32), [0.0] * 4, {"mu": 1}):
        with pytest.raises(CodecError, match="pickle"):
            decode_array(pickle.dumps(obj), what="dist:1 mu")


def test_a_float_array_that_starts_like_a_pickle_header_is_still_an_array() -> None:
    # 0x3f000280 little-endian is 80 02 00 3f: the PROTO 2 opcode of a pickle, yet a plain 0.50003815.
    x = np.frombuffer(bytes([0x80, 0x02, 0x00, 0x3F]) * 3, dtype="<f4")
    assert not looks_pickled(encode_array(x))
    out = decode_array(encode_array(x), size=3)
    assert math.isclose(float(out[0]), 0.50003815, rel_tol=1e-6)
    assert looks_pickled(pickle.dumps(x))


def test_check_array() -> None:
    a = np.zeros((2, 3), np.float32)
    assert codec.check_array(a, shape=(2, 3)) is a
    with pytest.raises(CodecError, match=r"w has shape \(2, 3\), expected \(3, 2\)"):
        codec.check_array(a, shape=(3, 2), what="w")
    with pytest.raises(CodecError, match="should be an array, got list"):
        codec.check_array([1.0])
    a[0, 0] = np.nan
    with pytest.raises(CodecError, match="non-finite"):
        codec.check_array(a)
