"""Build kpack's dispatch pack: one kernel, ``axpy``, in ten variants.

The pack exercises the dispatch part of the format (docs/pack-format.md,
"Dispatch: buckets, specializations, grid expressions"): three ``n`` buckets,
each with its own config, and per bucket the specializations Triton's JIT
would compile -- generic, ``div16`` (16-byte aligned pointers, ``n`` a multiple
of 16) and ``div16`` + ``stride_x == 1`` (``eq1``: compiled away) -- plus an
``n: i64`` build for ``n >= 2**31``.  The kernel's math, the variants and the
limits are specified in ``tools/README.md``.

Compiling needs no GPU.  Run with ``tools/`` on ``PYTHONPATH``::

    python3 -m kpack_tools.build_dispatch_pack --out kernels/dispatchpack [--target 90]
"""

import re
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Tuple

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from kpack_tools import fixed_pack
from kpack_tools.cubin import parse_cubin
from kpack_tools.pack import Kernel, Variant, pack_bytes
from kpack_tools.param_types import HIDDEN_PARAMS, slot_size

KERNEL = "axpy"


@triton.jit
def axpy_kernel(x_ptr, y_ptr, out_ptr, n, stride_x, alpha, BLOCK: tl.constexpr):
    # Element indices in n's type: i32 in the i32 builds, i64 in the n: i64 build.
    # tl.program_id is always i32, so without the cast `pid * BLOCK` would wrap
    # at 2**31 even when n is i64.
    pid = tl.program_id(0).to(n.dtype)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    # x's element index i * stride_x in 64 bits in every build: i and stride_x
    # each fit in 32 bits, their product need not.  (stride_x == 1 folds it away.)
    x = tl.load(x_ptr + offs.to(tl.int64) * stride_x, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, alpha * x + y, mask=mask)


PARAMS = (("x_ptr", "*fp32"), ("y_ptr", "*fp32"), ("out_ptr", "*fp32"), ("n", "i32"),
          ("stride_x", "i32"), ("alpha", "fp32"), ("BLOCK", "constexpr"))
BUCKETS = ({"param": "n", "edges": [4096, 262144]},)
GRID = ("cdiv(n, BLOCK)",)
# One config per n bucket: n <= 4096, 4096 < n <= 262144, n > 262144.
BUCKET_CONFIGS = ({"BLOCK": 256, "num_warps": 2},
                  {"BLOCK": 1024, "num_warps": 4},
                  {"BLOCK": 4096, "num_warps": 8})
DIV16_PARAMS = ("x_ptr", "y_ptr", "out_ptr", "n")
# No FMA contraction: alpha * x and + y round separately, so a float32 numpy
# reference evaluated as a multiply then an add is bit-exact.
COMMON_OPTIONS = {"enable_fp_fusion": False}


@dataclass(frozen=True)
class VariantSpec:
    """One variant: its bucket's config and the specialization it is built for."""

    name: str
    bucket: int
    block: int
    num_warps: int
    assumptions: Mapping[str, Tuple[str, ...]]
    types: Mapping[str, str]

    @property
    def div16(self):
        return [p for p, kinds in self.assumptions.items() if "div16" in kinds]

    @property
    def eq1(self):
        return [p for p, kinds in self.assumptions.items() if "eq1" in kinds]


def variant_specs() -> Tuple[VariantSpec, ...]:
    """All variants in manifest order (the order breaks no ties that matter:
    the i64 build loses to the i32 ones on type width whenever both fit)."""
    specs = []
    div16 = {p: ("div16",) for p in DIV16_PARAMS}
    for bucket, config in enumerate(BUCKET_CONFIGS):
        for suffix, assumptions in (("generic", {}), ("div16", div16),
                                    ("div16_unit", {**div16, "stride_x": ("eq1",)})):
            specs.append(VariantSpec(f"b{bucket}_{suffix}", bucket, config["BLOCK"],
                                     config["num_warps"], assumptions, {}))
    config = BUCKET_CONFIGS[2]
    specs.append(VariantSpec("b2_generic_i64", 2, config["BLOCK"], config["num_warps"],
                             {}, {"n": "i64"}))
    return tuple(specs)


def expected_layout(spec: VariantSpec):
    """The call parameters (eq1 dropped, types applied) and hidden pointers,
    with their slot sizes, in cubin order."""
    types = dict(PARAMS)
    types.update(spec.types)
    expected = [(name, slot_size(types[name])) for name, t in PARAMS
                if t != "constexpr" and name not in spec.eq1]
    return expected + [(name, 8) for name in HIDDEN_PARAMS]


_TTIR_ARG = re.compile(r"%(\w+): (\S+?)( \{tt\.divisibility = 16 : i32\})? loc\(")


def _ttir_signature(ttir: str):
    """``{arg: (mlir type, has divisibility 16)}`` of the kernel function in TTIR."""
    match = re.search(r"tt\.func public @axpy_kernel\((.*)\) attributes", ttir)
    if match is None:
        raise RuntimeError("axpy_kernel: no tt.func in the TTIR")
    return {name: (mlir_type, bool(div)) for name, mlir_type, div
            in _TTIR_ARG.findall(match.group(1))}


def _check_compiled(spec: VariantSpec, compiled) -> None:
    """Fail if Triton did not build the specialization ``spec`` describes."""
    where = f"{KERNEL}: variant '{spec.name}'"
    signature = _ttir_signature(compiled.asm["ttir"])
    want_args = [name for name, t in PARAMS if t != "constexpr" and name not in spec.eq1]
    if list(signature) != want_args:
        raise RuntimeError(f"{where}: TTIR arguments {list(signature)}, expected {want_args}")
    for name, (mlir_type, div) in signature.items():
        if div != (name in spec.div16):
            raise RuntimeError(f"{where}: '{name}' tt.divisibility is {div}, "
                               f"expected {name in spec.div16}")
    n_type = {"i32": "i32", "i64": "i64"}[spec.types.get("n", "i32")]
    if signature["n"][0] != n_type:
        raise RuntimeError(f"{where}: n is {signature['n'][0]} in the TTIR, expected {n_type}")
    # What the specializations buy, visible in the PTX: div16 vectorizes the
    # y loads and out stores; stride_x == 1 vectorizes the x loads too.
    ptx = compiled.asm["ptx"]
    vector = len(re.findall(r"\b(?:ld|st)\.global\.v4\.b32", ptx))
    scalar_loads = len(re.findall(r"\bld\.global\.b32", ptx))
    if not spec.div16 and vector:
        raise RuntimeError(f"{where}: generic build has vector accesses")
    if spec.div16 and not vector:
        raise RuntimeError(f"{where}: div16 build has no 16-byte accesses")
    if spec.eq1 and scalar_loads:
        raise RuntimeError(f"{where}: stride_x == 1 build still has scalar loads")
    if "fma.rn.f32" in ptx:
        raise RuntimeError(f"{where}: alpha * x + y was contracted to an FMA")
    slots = parse_cubin(compiled.asm["cubin"]).layouts[compiled.metadata.name]
    want = [size for _, size in expected_layout(spec)]
    if [s.size for s in slots] != want:
        raise RuntimeError(f"{where}: cubin slot sizes {[s.size for s in slots]}, "
                           f"expected {want}")


def compile_variant(spec: VariantSpec, target: int):
    """Compile one variant for ``sm_<target>``.

    ``div16`` parameters get Triton's ``tt.divisibility = 16`` attribute; an
    ``eq1`` parameter becomes a ``constexpr`` 1 (what Triton 3.6's JIT does
    with an int argument equal to 1), which removes it from the cubin; a
    ``types`` override changes the parameter's signature type.
    """
    signature = dict(PARAMS)
    signature.update(spec.types)
    constexprs = {"BLOCK": spec.block}
    for name in spec.eq1:
        signature[name] = "constexpr"
        constexprs[name] = 1
    if list(signature) != axpy_kernel.arg_names:
        raise ValueError(f"params {list(signature)} do not match {axpy_kernel.arg_names}")
    attrs = {(axpy_kernel.arg_names.index(name),): [["tt.divisibility", 16]]
             for name in spec.div16}
    src = ASTSource(fn=axpy_kernel, signature=signature, constexprs=constexprs, attrs=attrs)
    with fixed_pack.line_info_disabled():
        compiled = triton.compile(src, target=GPUTarget("cuda", target, 32),
                                  options={**COMMON_OPTIONS, "num_warps": spec.num_warps})
    _check_compiled(spec, compiled)
    return compiled


def _format_assumptions(assumptions) -> str:
    """``{"x": ["div16"], "s": ["eq1"]}`` -> ``div16(x) eq1(s)``; ``-`` if none."""
    parts = []
    for kind in ("div16", "eq1"):
        params = [p for p, kinds in (assumptions or {}).items() if kind in kinds]
        if params:
            parts.append(f"{kind}({','.join(params)})")
    return " ".join(parts) or "-"


def build(out_dir, target: int = 90, log: Optional[Callable[[str], None]] = print):
    """Compile every variant, write the pack and return its manifest."""
    log = log or (lambda line: None)
    variants = []
    for spec in variant_specs():
        compiled = compile_variant(spec, target)
        variants.append(Variant.from_compiled(
            spec.name, compiled, {"BLOCK": spec.block}, bucket=[spec.bucket],
            assumptions={p: list(k) for p, k in spec.assumptions.items()} or None,
            types=dict(spec.types) or None))
    kernel = Kernel(name=KERNEL, params=PARAMS, variants=variants,
                    buckets=[dict(b) for b in BUCKETS], grid=list(GRID))
    manifest = fixed_pack.write(out_dir, [kernel], "kpack_tools.build_dispatch_pack", log=None)
    _check_manifest(manifest)

    log(f"{'variant':15} {'bucket':>6} {'BLOCK':>5} {'warps':>5} {'shared':>6}  "
        f"{'assumptions':41} {'types':7} layout (param@offset:size)")
    for entry in manifest["kernels"][0]["variants"]:
        layout = " ".join(f"{s['param']}@{s['offset']}:{s['size']}" for s in entry["layout"])
        types = ",".join(f"{p}:{t}" for p, t in entry.get("types", {}).items()) or "-"
        log(f"{entry['name']:15} {str(entry['bucket']):>6} {entry['constexprs']['BLOCK']:5} "
            f"{entry['num_warps']:5} {entry['shared']:6}  "
            f"{_format_assumptions(entry.get('assumptions')):41} {types:7} {layout}")
    log(f"wrote {out_dir}: kernel '{KERNEL}', {len(variants)} variants, "
        f"{pack_bytes(out_dir)} bytes")
    return manifest


def _check_manifest(manifest) -> None:
    """The written layouts are the ones this kernel must have."""
    specs = {spec.name: spec for spec in variant_specs()}
    for entry in manifest["kernels"][0]["variants"]:
        spec = specs[entry["name"]]
        got = [(s["param"], s["size"]) for s in entry["layout"]]
        if got != expected_layout(spec):
            raise RuntimeError(f"{KERNEL}: variant '{spec.name}': layout {got}, "
                               f"expected {expected_layout(spec)}")
        if entry["num_warps"] != spec.num_warps or entry["constexprs"] != {"BLOCK": spec.block}:
            raise RuntimeError(f"{KERNEL}: variant '{spec.name}': wrong config")


def main(argv=None):
    fixed_pack.main(__doc__, build, argv)


if __name__ == "__main__":
    main()
