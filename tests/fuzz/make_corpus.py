#!/usr/bin/env python3
"""Regenerates the seed corpora in tests/fuzz/corpus/ (needs numpy).

The manifests and cubins are copies of the real packs' files; the rest is made here.
Run from anywhere: python3 tests/fuzz/make_corpus.py. Files are rewritten in place, so
the output is the same on every run.
"""

import copy
import hashlib
import io
import json
import pathlib
import shutil
import struct

import numpy as np

FUZZ = pathlib.Path(__file__).resolve().parent
ROOT = FUZZ.parents[1]
CORPUS = FUZZ / "corpus"


def put(target, name, data):
    d = CORPUS / target
    d.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    (d / name).write_bytes(data)


# ---------------------------------------------------------------------------------------
# manifest: three real manifests, then small hand-made ones (valid and broken).

def manifests():
    shutil.copyfile(ROOT / "kernels/testpack/manifest.json", CORPUS / "manifest/testpack.json")
    shutil.copyfile(ROOT / "kernels/dispatchpack/manifest.json",
                    CORPUS / "manifest/dispatchpack.json")
    # kpack/2 tensor descriptors (TMA and pointer forms) and flattened tuple parameters.
    shutil.copyfile(ROOT / "kernels/descpack/manifest.json", CORPUS / "manifest/descpack.json")
    shutil.copyfile(ROOT / "kernels/descpack_sm80/manifest.json",
                    CORPUS / "manifest/descpack_sm80.json")
    # kpack/2 with grid_tolerance (and source, readonly).
    shutil.copyfile(ROOT / "kernels/graphpack/manifest.json", CORPUS / "manifest/graphpack.json")
    sha = "0" * 64

    def variant(name, layout, **extra):
        v = {"name": name, "cubin": f"cubins/k/{name}.cubin", "sha256": sha, "entry": "k",
             "arch": 90, "constexprs": {"BLOCK": 256}, "num_warps": 4, "num_ctas": 1,
             "shared": 0, "global_scratch_size": 0, "global_scratch_align": 1,
             "profile_scratch_size": 0, "profile_scratch_align": 1, "launch_pdl": False,
             "launch_cooperative_grid": False, "layout": layout}
        v.update(extra)
        return v

    def kernel(params, variants, **extra):
        k = {"name": "k", "params": [{"name": n, "type": t} for n, t in params],
             "variants": variants}
        k.update(extra)
        return k

    def doc(*kernels):
        return {"format": "kpack/1", "generator": "fuzz", "kernels": list(kernels)}

    def dump(d):
        return json.dumps(d, separators=(",", ":"))

    params = [("x", "*fp32"), ("n", "i32"), ("m", "i32"), ("BLOCK", "constexpr")]
    layout = [{"param": "x", "offset": 0, "size": 8}, {"param": "n", "offset": 8, "size": 4},
              {"param": "m", "offset": 12, "size": 4}]
    minimal = doc(kernel(params, [variant("v", layout)], grid=["cdiv(n, BLOCK)", "m"]))
    put("manifest", "minimal.json", dump(minimal))

    # Buckets in two dims, div16/eq1 assumptions, and a variant typed i64 (a "fits"
    # property): the paths of DispatchTable::Build and Select.
    wide = copy.deepcopy(layout)
    wide[1] = {"param": "n", "offset": 8, "size": 8}
    wide[2] = {"param": "m", "offset": 16, "size": 4}
    dispatch = doc(kernel(
        params,
        [variant("generic", layout),
         variant("div16", layout, bucket=[1, 0], assumptions={"x": ["div16"], "n": ["div16"]}),
         variant("unit", layout[:2], bucket=[0, 1], assumptions={"m": ["eq1"]}),
         variant("wide", wide, types={"n": "i64"}, triton_version="3.6.0")],
        buckets=[{"param": "n", "edges": [-1, 4096]},
                 {"param": "m", "edges": [16, 9223372036854775807]}],
        grid=["cdiv(n, BLOCK) * max(m, 1)", "min(n, 65535)", "-n / 2"]))
    put("manifest", "dispatch.json", dump(dispatch))

    scratch = doc(kernel(params, [variant(
        "s", layout + [{"param": "$global_scratch", "offset": 16, "size": 8},
                       {"param": "$profile_scratch", "offset": 24, "size": 8}],
        global_scratch_size=128, global_scratch_align=16, profile_scratch_size=64,
        profile_scratch_align=8, launch_pdl=True, num_ctas=2, num_stages=3)]))
    put("manifest", "scratch.json", dump(scratch))

    # 70 properties: more than one 64-bit mask word (DispatchTable::SelectWide).
    def pointers(count, name, div16):
        return doc(kernel(
            [(f"p{i}", "*fp32") for i in range(count)],
            [variant("generic", [{"param": f"p{i}", "offset": 8 * i, "size": 8}
                                 for i in range(count)], constexprs={}),
             variant(name, [{"param": f"p{i}", "offset": 8 * i, "size": 8}
                            for i in range(count)],
                     constexprs={}, assumptions={f"p{i}": ["div16"] for i in div16})]))
    put("manifest", "many_properties.json", dump(pointers(70, "all", range(70))))
    # Passes ParseManifest; fails when Open builds the dispatch table (257 properties).
    put("manifest", "too_many_properties.json", dump(pointers(257, "all", range(257))))

    # 65 x 65 buckets: more than DispatchTable's 4096.
    buckets = copy.deepcopy(minimal)
    buckets["kernels"][0]["buckets"] = [{"param": "n", "edges": list(range(64))},
                                        {"param": "m", "edges": list(range(64))}]
    put("manifest", "too_many_buckets.json", dump(buckets))

    # Bucket 2 (n > 4096) has no variant: DispatchTable::Build refuses it.
    gap = copy.deepcopy(minimal)
    gap["kernels"][0]["buckets"] = [{"param": "n", "edges": [16, 4096]}]
    gap["kernels"][0]["variants"] = [variant("b0", layout, bucket=[0]),
                                     variant("b1", layout, bucket=[1], assumptions={"n": ["div16"]})]
    put("manifest", "bucket_without_variant.json", dump(gap))

    # 65 buckets x 10 properties (more than the old flat table's 65536 entries).
    big = [(f"p{i}", "*fp32") for i in range(10)] + [("n", "i32")]
    table = doc(kernel(
        big,
        [variant("all", [{"param": f"p{i}", "offset": 8 * i, "size": 8} for i in range(10)] +
                 [{"param": "n", "offset": 80, "size": 4}],
                 constexprs={}, assumptions={f"p{i}": ["div16"] for i in range(10)})],
        buckets=[{"param": "n", "edges": list(range(64))}]))
    put("manifest", "dispatch_table_too_big.json", dump(table))

    # kpack/2: the tools' source, readonly and autotune_key fields.
    tools = copy.deepcopy(minimal)
    tools["format"] = "kpack/2"
    tools["kernels"][0]["source"] = {"qualname": "model.kernels.k", "sha256": "ab" * 32}
    tools["kernels"][0]["params"][0]["readonly"] = True
    tools["kernels"][0]["autotune_key"] = ["n", "BLOCK"]
    put("manifest", "tool_fields_v2.json", dump(tools))

    # Grid expressions that fail to compile at Open (the manifest itself is fine).
    grid = copy.deepcopy(minimal)
    grid["kernels"][0]["grid"] = ["n / 0", "x + 1", "BLOCK * 9223372036854775807"]
    grid["kernels"][0]["variants"][0]["constexprs"] = {"BLOCK": 1.5}
    put("manifest", "grid_errors.json", dump(grid))

    # Broken: not JSON, wrong format, unknown field, overlapping slots, TMA descriptor.
    put("manifest", "broken_truncated.json", dump(minimal)[:150])
    put("manifest", "broken_format.json", dump(dict(minimal, format="kpack/2")))
    bad = copy.deepcopy(minimal)
    bad["kernels"][0]["variants"][0]["num_wraps"] = 4
    put("manifest", "broken_unknown_field.json", dump(bad))
    bad = copy.deepcopy(minimal)
    bad["kernels"][0]["variants"][0]["layout"][2]["offset"] = 8
    put("manifest", "broken_overlap.json", dump(bad))
    bad = copy.deepcopy(minimal)
    bad["kernels"][0]["params"][0]["type"] = "nvTmaDesc"
    put("manifest", "broken_tma.json", dump(bad))


# ---------------------------------------------------------------------------------------
# grid_expr: kinds-and-mode byte + three little-endian 64-bit argument values + the rest
# (the format grid_expr_fuzz.cc documents). Kinds: 0 int64, 1 uint64, 2 CUdeviceptr,
# 3 double; 2 bits per argument, argument 0 lowest; mode in the top 2 bits: 0 text (the
# rest an expression), 1-3 oracle (the rest drives the generator of expression trees).

def grid_input(kinds, values, rest, mode=0):
    header = bytes([kinds[0] | kinds[1] << 2 | kinds[2] << 4 | mode << 6])
    for v in values:
        header += struct.pack("<Q", v & (2**64 - 1))
    return header + (rest.encode() if isinstance(rest, str) else rest)


def grid_exprs():
    i64min, i64max = -2**63, 2**63 - 1
    cases = [
        ("cdiv_block", (0, 0, 0), (1025, 64, 3), "cdiv(n, BLOCK)"),
        ("div", (0, 0, 0), (10, 3, 0), "n / 3"),
        ("precedence", (0, 0, 0), (10, 3, 0), "n - m * 2"),
        ("parens", (0, 0, 0), (10, 3, 0), "(n - m) * 2"),
        ("min_max", (0, 0, 0), (10, 3, 0), "min(n, 4) + max(m, 7)"),
        ("neg", (0, 0, 0), (5, 0, 0), "-n + 20"),
        ("matmul", (0, 1, 2), (300, 100, 7), "cdiv(n, 128) * cdiv(m, 64)"),
        ("folded", (0, 0, 0), (0, 0, 0), "cdiv(4096, BLOCK) * 2 + 1"),
        ("spaces", (0, 0, 0), (0, 0, 0), "  42 "),
        ("div_by_zero_const", (0, 0, 0), (1, 1, 1), "n / ZERO"),
        ("runtime_div_by_zero", (0, 0, 0), (7, 4, 4), "n / (m - k)"),
        ("nested", (0, 0, 0), (1, 2, 3), "max(min(n, m), -k) * ((((n))))"),
        ("overflow", (0, 0, 0), (i64max, 2, 0), "n * m + 1"),
        ("fold_overflow", (0, 0, 0), (0, 0, 0), "9223372036854775807 + 1"),
        ("unsigned_big", (1, 2, 0), (2**63, 2**64 - 1, 0), "n + m"),
        ("not_integer", (3, 0, 0), (0x3ff8000000000000, 0, 0), "n + 1"),
        ("min_value", (0, 0, 0), (i64min, -1, 0), "n / m"),
        ("deep", (0, 0, 0), (1, 1, 1), "-" * 15 + "n"),
    ]
    for name, kinds, values, text in cases:
        put("grid_expr", name + ".bin", grid_input(kinds, values, text))
    # Oracle mode: generator bytes (any bytes make a tree), small and huge arguments.
    for i, (kinds, values) in enumerate([((0, 0, 0), (1000, 64, 3)), ((0, 1, 2), (7, 2**63, 16)),
                                         ((0, 0, 0), (i64max, i64min, -1)),
                                         ((3, 0, 0), (0x3ff8000000000000, 5, 0))]):
        generator = hashlib.sha256(f"grid_expr tree {i}".encode()).digest() * 3
        put("grid_expr", f"tree_{i}.bin", grid_input(kinds, values, generator, mode=1))


# ---------------------------------------------------------------------------------------
# cubin: the smallest real cubins.

def cubins():
    for src, name in [("kernels/dispatchpack/cubins/axpy/b0_div16_unit.cubin", "axpy_b0_div16_unit.cubin"),
                      ("kernels/testpack/cubins/cluster/default.cubin", "cluster.cubin"),
                      ("kernels/testpack/cubins/scalars/default.cubin", "scalars.cubin"),
                      ("kernels/testpack/cubins/add/default.cubin", "add.cubin"),
                      ("kernels/descpack/cubins/copy_tma/default.cubin", "copy_tma.cubin")]:
        shutil.copyfile(ROOT / src, CORPUS / "cubin" / name)


# ---------------------------------------------------------------------------------------
# npy: small arrays of each supported kind, each header version, and rejected ones.

def npy_bytes(array, version=None):
    buf = io.BytesIO()
    np.lib.format.write_array(buf, array, version=version, allow_pickle=False)
    return buf.getvalue()


def npys():
    put("npy", "f32_1d.npy", npy_bytes(np.arange(5, dtype=np.float32)))
    put("npy", "f16_3d.npy", npy_bytes(np.ones((2, 1, 3), dtype=np.float16)))
    put("npy", "i8_scalar.npy", npy_bytes(np.array(-7, dtype=np.int8)))
    put("npy", "u64_empty.npy", npy_bytes(np.zeros((0, 3), dtype=np.uint64)))
    put("npy", "bool_2d.npy", npy_bytes(np.array([[True, False], [False, True]])))
    put("npy", "i32_v2.npy", npy_bytes(np.arange(3, dtype=np.int32), version=(2, 0)))
    put("npy", "u16_v3.npy", npy_bytes(np.arange(4, dtype=np.uint16), version=(3, 0)))
    put("npy", "f64_fortran.npy", npy_bytes(np.asfortranarray(np.ones((2, 2)))))
    put("npy", "i32_big_endian.npy", npy_bytes(np.arange(2, dtype=">i4")))
    put("npy", "truncated.npy", npy_bytes(np.arange(8, dtype=np.int64))[:-5])
    put("npy", "structured.npy", npy_bytes(np.zeros(2, dtype=[("a", "<i4"), ("b", "<f4")])))
    put("npy", "dims_65.npy", npy_header("{'descr': '<u1', 'fortran_order': False, "
                                         "'shape': (" + "1, " * 65 + "), }"))
    put("npy", "object.npy", npy_header("{'descr': '|O', 'fortran_order': False, 'shape': (), }"))


def npy_header(text):
    """A version 1.0 .npy file with this header and no data."""
    header = text.encode() + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header


def main():
    for target in ("manifest", "grid_expr", "cubin", "npy"):
        d = CORPUS / target
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
    manifests()
    grid_exprs()
    cubins()
    npys()


if __name__ == "__main__":
    main()
