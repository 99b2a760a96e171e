"""Interop helper for tests/gguf_interop.rs, driving the reference Python package `gguf`.

    gguf_interop.py write OUT.gguf OUT.json   GGUFWriter writes every value type, arrays and
                                              tensors; OUT.json describes what was written.
    gguf_interop.py read IN.gguf OUT.json     GGUFReader reads IN.gguf; OUT.json describes it.
    gguf_interop.py quant OUT.gguf            for every type gguf.quants can quantize: an F32
                                              tensor "src.<type>" and "q.<type>", its quantization.

JSON: {"kv": [{"key", "type", "elem", "value"}], "tensors": [{"name", "type", "shape", "data"}]}
with type ids as in GGUF, shapes in ggml order (ne[0] first), data in hex, and floats as their
IEEE bit patterns (so NaN and -0.0 compare exactly).
"""

import json
import sys

import numpy as np
import gguf
from gguf import GGUFValueType as T
from gguf import GGMLQuantizationType as Q


def enc(vtype, v):
    if vtype == T.FLOAT32:
        return int(np.array([v], dtype=np.float32).view(np.uint32)[0])
    if vtype == T.FLOAT64:
        return int(np.array([v], dtype=np.float64).view(np.uint64)[0])
    if vtype == T.BOOL:
        return bool(v)
    if vtype == T.STRING:
        return v if isinstance(v, str) else str(bytes(v), encoding="utf-8")
    return int(v)


SCALARS = [
    ("t.u8", T.UINT8, 255),
    ("t.i8", T.INT8, -128),
    ("t.u16", T.UINT16, 65535),
    ("t.i16", T.INT16, -32768),
    ("t.u32", T.UINT32, 4294967295),
    ("t.i32", T.INT32, -2147483648),
    ("t.f32", T.FLOAT32, -1.5),
    ("t.f32_nan", T.FLOAT32, float("nan")),
    ("t.f32_neg_zero", T.FLOAT32, -0.0),
    ("t.bool_true", T.BOOL, True),
    ("t.bool_false", T.BOOL, False),
    ("t.str", T.STRING, "héllo wörld ✓"),
    ("t.u64", T.UINT64, 18446744073709551615),
    ("t.i64", T.INT64, -9223372036854775808),
    ("t.f64", T.FLOAT64, 3.141592653589793),
]

ARRAYS = [
    ("a.u8", T.UINT8, [0, 1, 255]),
    ("a.i8", T.INT8, [-128, 0, 127]),
    ("a.u16", T.UINT16, [0, 65535]),
    ("a.i16", T.INT16, [-32768, 32767]),
    ("a.u32", T.UINT32, [1, 2, 4294967295]),
    ("a.i32", T.INT32, [-1, 0, 1]),
    ("a.f32", T.FLOAT32, [0.5, -2.25, 1e30]),
    ("a.bool", T.BOOL, [True, False, True]),
    ("a.str", T.STRING, ["", "a", "tokens ▁the", "日本"]),
    ("a.u64", T.UINT64, [0, 18446744073709551615]),
    ("a.i64", T.INT64, [-9223372036854775808, 9223372036854775807]),
    ("a.f64", T.FLOAT64, [1e-300, -0.0]),
]


def tensors(rng):
    """(name, ggml type, ne, bytes) of the tensors to write."""
    out = []
    x = rng.standard_normal((3, 64)).astype(np.float32)  # numpy shape [rows, cols] = ne [64, 3]
    out.append(("f32", Q.F32, x))
    out.append(("f16", Q.F16, x.astype(np.float16)))
    for qt in (Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.BF16):
        out.append((qt.name.lower(), qt, gguf.quants.quantize(x, qt)))
    # a 1-d and a 4-d tensor
    out.append(("vec", Q.F32, rng.standard_normal(5).astype(np.float32)))
    out.append(("cube", Q.F32, rng.standard_normal((2, 1, 3, 2)).astype(np.float32)))
    return out


def write(path, json_path):
    rng = np.random.default_rng(1)
    w = gguf.GGUFWriter(path, arch="interop")
    kv = [{"key": "general.architecture", "type": int(T.STRING), "elem": None, "value": "interop"}]
    for key, ty, v in SCALARS:
        w.add_key_value(key, v, ty)
        kv.append({"key": key, "type": int(ty), "elem": None, "value": enc(ty, v)})
    for key, ty, v in ARRAYS:
        w.add_key_value(key, v, T.ARRAY, sub_type=ty)
        kv.append({"key": key, "type": int(T.ARRAY), "elem": int(ty), "value": [enc(ty, e) for e in v]})
    ts = []
    for name, qt, data in tensors(rng):
        if qt in (Q.F32, Q.F16):
            w.add_tensor(name, data)
            ne = list(reversed(data.shape))
        else:
            w.add_tensor(name, data, raw_dtype=qt)
            ne = list(reversed(gguf.quants.quant_shape_from_byte_shape(data.shape, qt)))
        ts.append({"name": name, "type": int(qt), "shape": ne, "data": data.tobytes().hex()})
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with open(json_path, "w") as f:
        json.dump({"kv": kv, "tensors": ts}, f)


def read(path, json_path):
    r = gguf.GGUFReader(path)
    kv = []
    for field in r.fields.values():
        if field.name.startswith("GGUF."):
            continue
        main = field.types[0]
        if main == T.ARRAY:
            elem = field.types[-1]
            vals = [enc(elem, field.parts[i] if elem == T.STRING else field.parts[i][0]) for i in field.data]
            kv.append({"key": field.name, "type": int(main), "elem": int(elem), "value": vals})
        else:
            v = field.parts[-1] if main == T.STRING else field.parts[-1][0]
            kv.append({"key": field.name, "type": int(main), "elem": None, "value": enc(main, v)})
    ts = []
    for t in r.tensors:
        ts.append({
            "name": t.name,
            "type": int(t.tensor_type),
            "shape": [int(d) for d in t.shape],
            "data": t.data.tobytes().hex(),
            "n_bytes": int(t.n_bytes),
        })
    with open(json_path, "w") as f:
        json.dump({"kv": kv, "tensors": ts, "alignment": int(r.alignment)}, f)


def quant(path):
    rng = np.random.default_rng(7)
    w = gguf.GGUFWriter(path, arch="quant")
    done = []
    for qt in Q:
        if qt in (Q.F32,):
            continue
        bs, _ = gguf.GGML_QUANT_SIZES[qt]
        # 4 rows of 2 super-blocks; rows of very different scales, one row of zeros
        x = rng.standard_normal((4, 512)).astype(np.float32)
        x[1] *= 1e-3
        x[2] *= 100.0
        x[3] = 0.0
        if 512 % bs != 0:
            continue
        try:
            q = gguf.quants.quantize(x, qt)
        except (NotImplementedError, gguf.quants.QuantError):
            continue
        name = qt.name.lower()
        w.add_tensor("src." + name, x)
        if qt == Q.F16:
            w.add_tensor("q." + name, q)
        else:
            w.add_tensor("q." + name, q, raw_dtype=qt)
        done.append(qt.name)
    w.add_array("interop.quantized_types", done)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "write":
        write(sys.argv[2], sys.argv[3])
    elif cmd == "read":
        read(sys.argv[2], sys.argv[3])
    elif cmd == "quant":
        quant(sys.argv[2])
    else:
        sys.exit(f"unknown command {cmd}")
