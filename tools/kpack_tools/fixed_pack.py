"""What the builders of the repository's fixed packs share.

A fixed pack is a few kernels compiled with the constexprs and options written in its
builder, no tuning: the test pack (``build_test_pack``), the dispatch pack
(``build_dispatch_pack``), the benchmark pack (``build_bench_pack``), the scalar pack
(``build_scalar_pack``), the descriptor packs (``build_desc_pack``) and the
wrong-architecture pack (``build_arch_pack``).  Each builder describes its kernels; this
module compiles them reproducibly (``compile_kernel``: no line info, so a cubin is the
same from any checkout), writes and reports the pack (``write``) and gives every builder
the same command line (``main``: ``--out PACK [--target 90]``).
"""

import argparse
import contextlib
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence, Tuple

from kpack_tools.pack import Kernel, Variant, pack_bytes, write_pack

# The variant name of a kernel that has one variant.
VARIANT = "default"


@dataclass(frozen=True)
class FixedKernel:
    """How to compile one kernel of a fixed pack, and what its metadata must show.

    ``params`` are the pack's parameters (tuples flattened, ``t.0``); ``signature`` is
    what ``ASTSource`` takes when it differs (a tuple parameter's element types as a
    tuple), else derived from ``params``.  ``requirement`` is ``(description, predicate
    on the metadata)``: the feature the kernel exists to test, checked so that a Triton
    change that silently drops it fails the build instead of weakening the tests.
    ``grid`` (optional) the manifest's grid expressions.
    """

    name: str
    fn: Any
    params: Tuple[Tuple[str, str], ...]
    constexprs: Mapping[str, Any]
    options: Mapping[str, Any]
    requirement: Optional[Tuple[str, Callable[[Any], bool]]] = None
    signature: Optional[Mapping[str, Any]] = None
    grid: Optional[Sequence[str]] = None

    def kernel(self, compiled, name: Optional[str] = None) -> Kernel:
        """The pack kernel of one compile of this kernel: one variant, ``VARIANT``."""
        return Kernel(name=name or self.name, params=self.params,
                      variants=[Variant.from_compiled(VARIANT, compiled, self.constexprs)],
                      grid=self.grid)


@contextlib.contextmanager
def line_info_disabled():
    """Compile without line info, restoring the environment afterwards.

    Line info embeds the absolute path of the kernel's file in every cubin, so cubins
    would differ between checkouts; without it they are byte-identical wherever they
    are built, and half the size.  Triton reads the variable at compile time and
    includes it in its cache key.
    """
    old = os.environ.get("TRITON_DISABLE_LINE_INFO")
    os.environ["TRITON_DISABLE_LINE_INFO"] = "1"
    try:
        yield
    finally:
        if old is None:
            del os.environ["TRITON_DISABLE_LINE_INFO"]
        else:
            os.environ["TRITON_DISABLE_LINE_INFO"] = old


def compile_kernel(spec: FixedKernel, target: int):
    """Compile one kernel for ``sm_<target>`` and check its requirement.

    No divisibility attributes are passed: the variant must be correct for any
    pointer alignment and integer value a caller passes.
    """
    import triton  # noqa: PLC0415 (the module is importable without Triton)
    from triton.backends.compiler import GPUTarget  # noqa: PLC0415
    from triton.compiler import ASTSource  # noqa: PLC0415
    signature = dict(spec.signature or spec.params)
    if list(signature) != spec.fn.arg_names:
        raise ValueError(f"{spec.name}: params {list(signature)} do not match "
                         f"the function's {spec.fn.arg_names}")
    src = ASTSource(fn=spec.fn, signature=signature, constexprs=dict(spec.constexprs), attrs={})
    with line_info_disabled():
        compiled = triton.compile(src, target=GPUTarget("cuda", target, 32),
                                  options=dict(spec.options))
    if spec.requirement is not None:
        description, holds = spec.requirement
        if not holds(compiled.metadata):
            raise RuntimeError(f"{spec.name}: compiled kernel does not satisfy {description}")
    return compiled


def generator(module: str) -> str:
    """The manifest's ``generator`` of a pack built by ``module``."""
    import triton  # noqa: PLC0415
    return f"{module} (triton {triton.__version__})"


def write(out_dir, kernels: Sequence[Kernel], module: str,
          log: Optional[Callable[[str], None]] = print, **extra) -> Mapping[str, Any]:
    """Write the pack of ``kernels`` built by ``module`` (its ``generator``), log what was
    written, and return the manifest. ``extra`` goes to ``write_pack``."""
    manifest = write_pack(out_dir, kernels, generator=generator(module), **extra)
    variants = sum(len(k.variants) for k in kernels)
    (log or (lambda line: None))(
        f"wrote {out_dir}: {len(kernels)} kernel{'s' if len(kernels) != 1 else ''} "
        f"({', '.join(k.name for k in kernels)}), {variants} variant"
        f"{'s' if variants != 1 else ''}, {pack_bytes(out_dir)} bytes")
    return manifest


def main(doc: str, build: Callable[..., Any], argv=None) -> None:
    """The command line of a fixed-pack builder: ``--out PACK [--target 90]``, then
    ``build(out, target)``."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", required=True, help="pack directory to (re)write")
    parser.add_argument("--target", type=int, default=90,
                        help="CUDA compute capability, major*10+minor (default 90: sm_90a)")
    args = parser.parse_args(argv)
    build(args.out, args.target)
