#!/usr/bin/env python3
"""Writes tests/data/broken/: truncated, malformed and hostile .safetensors and
.npy files, and MANIFEST (one line per file: NAME|STATUS|TEXT, where loading
NAME must fail with xent status STATUS and a message containing TEXT).
Also writes two valid seed files for the fuzz targets to tests/fuzz/seeds/.
Standard library only; the output is committed, so this runs only when the
corpus changes:  python3 tests/data/make_broken.py"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "broken")
SEEDS = os.path.join(HERE, "..", "fuzz", "seeds")
manifest = []


def put(name, data, status, text):
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)
    manifest.append(f"{name}|{status}|{text}")


def st(header, data=b"", hlen=None):
    """A safetensors file from a header (dict or raw str/bytes)."""
    if isinstance(header, dict):
        header = json.dumps(header)
    if isinstance(header, str):
        header = header.encode()
    n = len(header) if hlen is None else hlen
    return struct.pack("<Q", n) + header + data


def ent(dtype="F32", shape=(4,), offs=(0, 16)):
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offs)}


def npy(header, data=b"", major=1, hlen=None):
    if isinstance(header, str):
        header = header.encode()
    n = len(header) if hlen is None else hlen
    pre = b"\x93NUMPY" + bytes([major, 0])
    pre += struct.pack("<H", n) if major == 1 else struct.pack("<I", n)
    return pre + header + data


def npy_dict(descr="'<f4'", fortran="False", shape="(4,)"):
    return "{'descr': %s, 'fortran_order': %s, 'shape': %s, }\n" % (descr, fortran, shape)


def safetensors_cases():
    good = st({"a": ent()}, bytes(16))
    put("st_empty.safetensors", b"", "FORMAT", "truncated")
    put("st_short_length.safetensors", b"\x10\x00\x00", "FORMAT", "truncated")
    put("st_header_past_eof.safetensors", st('{"a":1}', hlen=1000), "FORMAT", "runs past the end")
    put("st_header_len_huge.safetensors", st("{}", hlen=(1 << 63) + 5), "FORMAT", "runs past the end")
    put("st_truncated_header.safetensors", good[:20], "FORMAT", "runs past the end")
    put("st_truncated_data.safetensors", good[:-3], "FORMAT", "past the data block")
    put("st_offsets_past_end.safetensors", st({"a": ent(shape=(1000,), offs=(0, 4000))}, bytes(16)),
        "FORMAT", "past the data block")
    put("st_offsets_reversed.safetensors", st({"a": ent(offs=(16, 0))}, bytes(16)), "FORMAT", "reversed")
    put("st_offsets_overlap.safetensors",
        st({"a": ent(offs=(0, 16)), "b": ent(offs=(8, 24))}, bytes(24)), "FORMAT", "overlap")
    put("st_shape_overflow.safetensors", st({"a": ent(shape=(1 << 62, 4), offs=(0, 16))}, bytes(16)),
        "FORMAT", "overflow")
    put("st_bytes_overflow.safetensors", st({"a": ent(dtype="I64", shape=(1 << 61, 2), offs=(0, 16))},
                                            bytes(16)), "FORMAT", "overflow")
    put("st_dim_too_large.safetensors", st({"a": ent(shape=((1 << 62) + 1,), offs=(0, 16))}, bytes(16)),
        "FORMAT", "out of range")
    put("st_span_mismatch.safetensors", st({"a": ent(shape=(3,), offs=(0, 16))}, bytes(16)),
        "FORMAT", "need 12")
    put("st_offset_not_int.safetensors", st('{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,1.6e1]}}',
                                            bytes(16)), "FORMAT", "not non-negative integers")
    put("st_offset_20_digits.safetensors",
        st('{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,18446744073709551632]}}', bytes(16)),
        "FORMAT", "not non-negative integers")
    put("st_offsets_three.safetensors", st({"a": ent(offs=(0, 8, 16))}, bytes(16)), "FORMAT", "[begin, end]")
    put("st_bad_json.safetensors", st('{"a": {"dtype": "F32",,}}'), "FORMAT", "bad JSON")
    put("st_unterminated.safetensors", st('{"a": {"dtype": "F32"'), "FORMAT", "bad JSON")
    put("st_nested_10000.safetensors", st("[" * 10000 + "]" * 10000), "FORMAT", "nested too deeply")
    put("st_nested_obj.safetensors", st('{"a":' * 5000 + "1" + "}" * 5000), "FORMAT", "nested too deeply")
    put("st_unknown_dtype.safetensors", st({"a": ent(dtype="Q7")}, bytes(16)), "DTYPE", "unknown dtype 'Q7'")
    put("st_bool_dtype.safetensors", st({"mask": ent(dtype="BOOL", offs=(0, 4))}, bytes(4)),
        "DTYPE", "'mask': dtype BOOL is not supported")
    put("st_negative_dim.safetensors", st({"a": ent(shape=(-1,))}, bytes(16)), "FORMAT",
        "shape[0] is not a non-negative integer")
    put("st_float_dim.safetensors", st('{"a":{"dtype":"F32","shape":[4.0],"data_offsets":[0,16]}}', bytes(16)),
        "FORMAT", "shape[0] is not a non-negative integer")
    put("st_missing_shape.safetensors", st({"a": {"dtype": "F32", "data_offsets": [0, 16]}}, bytes(16)),
        "FORMAT", "\"shape\"")
    put("st_missing_dtype.safetensors", st({"a": {"shape": [4], "data_offsets": [0, 16]}}, bytes(16)),
        "FORMAT", "\"dtype\"")
    put("st_entry_not_object.safetensors", st({"a": [1, 2]}, bytes(16)), "FORMAT", "not a JSON object")
    put("st_header_array.safetensors", st("[1, 2]"), "FORMAT", "not a JSON object")
    put("st_duplicate_name.safetensors", st('{"a":%s,"a":%s}' % (json.dumps(ent()), json.dumps(ent())),
                                            bytes(16)), "FORMAT", "duplicate tensor name 'a'")
    put("st_trailing_garbage.safetensors", st('{} x'), "FORMAT", "trailing characters")
    put("st_bad_utf8.safetensors", st(b'{"\xff\xfe":1}'), "FORMAT", "UTF-8")
    put("st_control_char.safetensors", st(b'{"a\x01":1}'), "FORMAT", "control character")
    put("st_lone_surrogate.safetensors", st('{"\\udc00":1}'), "FORMAT", "surrogate")
    put("st_nine_dims.safetensors", st({"a": ent(shape=(1,) * 9, offs=(0, 4))}, bytes(4)), "FORMAT",
        "9 dimensions")
    put("st_metadata_not_string.safetensors", st({"__metadata__": {"k": 1}, "a": ent()}, bytes(16)),
        "FORMAT", "not a string")
    put("st_long_name.safetensors", st({"n" * 300: ent()}, bytes(16)), "FORMAT", "longer than")
    put("st_nul_in_name.safetensors", st('{"a\\u0000b":%s}' % json.dumps(ent()), bytes(16)), "FORMAT",
        "holds a NUL")
    put("st_no_tensors.safetensors", st("{}"), "NOT_FOUND", "holds no tensors")
    put("st_leading_zero.safetensors", st('{"a":{"dtype":"F32","shape":[04],"data_offsets":[0,16]}}',
                                          bytes(16)), "FORMAT", "bad JSON")


def npy_cases():
    d = npy_dict()
    put("npy_empty.npy", b"", "FORMAT", "truncated")
    put("npy_bad_magic.npy", b"\x93NUMPX\x01\x00" + npy(d)[8:] + bytes(16), "FORMAT", "magic")
    put("npy_version_4.npy", npy(d, bytes(16), major=4), "FORMAT", "version 4.0")
    put("npy_short_preamble.npy", npy(d)[:9], "FORMAT", "truncated")
    put("npy_header_past_eof.npy", npy(d, hlen=5000), "FORMAT", "runs past the end")
    put("npy_v2_header_huge.npy", npy(d, major=2, hlen=0xFFFFFFFF), "FORMAT", "runs past the end")
    put("npy_truncated_header.npy", npy(d)[:30], "FORMAT", "runs past the end")
    put("npy_truncated_data.npy", npy(npy_dict(shape="(100,)"), bytes(8)), "FORMAT", "truncated")
    put("npy_complex.npy", npy(npy_dict(descr="'<c8'"), bytes(32)), "DTYPE", "'<c8'")
    put("npy_bool.npy", npy(npy_dict(descr="'|b1'"), bytes(4)), "DTYPE", "'|b1'")
    put("npy_big_endian.npy", npy(npy_dict(descr="'>f4'"), bytes(16)), "DTYPE", "big-endian")
    put("npy_fortran.npy", npy(npy_dict(fortran="True", shape="(2, 2)"), bytes(16)), "FORMAT", "fortran_order")
    put("npy_structured.npy", npy(npy_dict(descr="[('a', '<f4')]"), bytes(16)), "DTYPE", "structured")
    put("npy_missing_shape.npy", npy("{'descr': '<f4', 'fortran_order': False}\n", bytes(16)), "FORMAT",
        "missing 'shape'")
    put("npy_missing_descr.npy", npy("{'fortran_order': False, 'shape': (4,)}\n", bytes(16)), "FORMAT",
        "missing 'descr'")
    put("npy_unknown_key.npy", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), 'x': 1}\n",
                                   bytes(16)), "FORMAT", "unknown key")
    put("npy_fortran_int.npy", npy(npy_dict(fortran="0"), bytes(16)), "FORMAT", "True or False")
    put("npy_negative_dim.npy", npy(npy_dict(shape="(-1,)"), bytes(16)), "FORMAT", "non-negative")
    put("npy_shape_overflow.npy", npy(npy_dict(shape="(4611686018427387904, 4)"), bytes(16)), "FORMAT",
        "overflow")
    put("npy_dim_huge.npy", npy(npy_dict(shape="(99999999999999999999999,)"), bytes(16)), "FORMAT",
        "too large")
    put("npy_nine_dims.npy", npy(npy_dict(shape="(1,1,1,1,1,1,1,1,1)"), bytes(4)), "FORMAT",
        "too many dimensions")
    put("npy_unterminated.npy", npy("{'descr': '<f4', 'fortran_order': False, 'shape': (4,)", bytes(16)),
        "FORMAT", "bad .npy header")
    put("npy_shape_not_tuple.npy", npy(npy_dict(shape="[4]"), bytes(16)), "FORMAT", "tuple")
    put("npy_duplicate_key.npy", npy("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, "
                                     "'shape': (4,)}\n", bytes(16)), "FORMAT", "duplicate 'descr'")
    put("npy_trailing.npy", npy(d.strip() + " junk\n", bytes(16)), "FORMAT", "trailing")


def seeds():
    os.makedirs(SEEDS, exist_ok=True)
    with open(os.path.join(SEEDS, "two.safetensors"), "wb") as f:
        f.write(st({"__metadata__": {"format": "pt"}, "a": ent(shape=(2, 2)),
                    "b": ent(dtype="I64", shape=(2,), offs=(16, 32))}, bytes(32)))
    with open(os.path.join(SEEDS, "one.npy"), "wb") as f:
        f.write(npy(npy_dict(shape="(2, 2)"), bytes(16)))


def main():
    os.makedirs(OUT, exist_ok=True)
    for f in os.listdir(OUT):
        os.remove(os.path.join(OUT, f))
    safetensors_cases()
    npy_cases()
    with open(os.path.join(OUT, "MANIFEST"), "w") as f:
        f.write("# NAME|STATUS|TEXT: loading NAME fails with STATUS, the message contains TEXT\n")
        f.write("\n".join(manifest) + "\n")
    seeds()
    print(f"wrote {len(manifest)} files to {OUT}")


if __name__ == "__main__":
    main()
