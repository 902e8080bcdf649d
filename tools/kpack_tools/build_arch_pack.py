"""Build kpack's wrong-architecture pack: the test pack's ``add`` kernel compiled for
sm_80 and for sm_100a, each as its own kernel (``add_sm80``, ``add_sm100``).

The pack is honest (manifest arch = the cubin's ELF arch, so ``kpack verify`` passes
offline); it exists so the tests can check that a runtime on an H200 (compute
capability 9.0) refuses both at load with an error naming the variant and launches
nothing. Compiling needs no GPU::

    python3 -m kpack_tools.build_arch_pack --out kernels/archpack
"""

from typing import Callable

from kpack_tools import fixed_pack
from kpack_tools.build_test_pack import TEST_KERNELS

ARCHS = (80, 100)


def build(out_dir, target: int = 90, log: Callable[[str], None] = print):
    """Writes the pack; `target` is ignored: the pack is made of other targets."""
    del target
    add = next(k for k in TEST_KERNELS if k.name == "add")
    kernels = [add.kernel(fixed_pack.compile_kernel(add, arch), name=f"add_sm{arch}")
               for arch in ARCHS]
    return fixed_pack.write(out_dir, kernels, "kpack_tools.build_arch_pack", log)


def main(argv=None):
    fixed_pack.main(__doc__, build, argv)


if __name__ == "__main__":
    main()
