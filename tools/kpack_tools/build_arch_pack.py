"""Build kpack's wrong-architecture pack: the test pack's ``add`` kernel compiled for
sm_80 and for sm_100a, each as its own kernel (``add_sm80``, ``add_sm100``).

The pack is honest (manifest arch = the cubin's ELF arch, so ``kpack verify`` passes
offline); it exists so the tests can check that a runtime on an H200 (compute
capability 9.0) refuses both at load with an error naming the variant and launches
nothing. Compiling needs no GPU::

    python3 -m kpack_tools.build_arch_pack --out kernels/archpack
"""

from typing import Callable

import triton

from kpack_tools.build_test_pack import TEST_KERNELS, VARIANT, compile_test_kernel
from kpack_tools.cli import run_build
from kpack_tools.pack import Kernel, Variant, pack_bytes, write_pack

GENERATOR = f"kpack_tools.build_arch_pack (triton {triton.__version__})"
ARCHS = (80, 100)


def build(out_dir, target: int = 90, log: Callable[[str], None] = print):
    """Writes the pack; `target` is ignored: the pack is made of other targets."""
    del target
    add = next(k for k in TEST_KERNELS if k.name == "add")
    kernels = []
    for arch in ARCHS:
        compiled = compile_test_kernel(add, arch)
        variant = Variant.from_compiled(VARIANT, compiled, add.constexprs)
        kernels.append(Kernel(name=f"add_sm{arch}", params=add.params, variants=[variant]))
    manifest = write_pack(out_dir, kernels, generator=GENERATOR)
    total = pack_bytes(out_dir)
    log(f"wrote {out_dir}: {len(kernels)} kernels ({', '.join(k.name for k in kernels)}), "
        f"{total} bytes")
    return manifest


def main(argv=None):
    run_build(__doc__, build, argv)


if __name__ == "__main__":
    main()
