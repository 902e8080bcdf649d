"""Builds kpack_torch_example, a torch C++ extension using kpack/torch.h, against the
installed kpack package (`pip install .` at the repository root first):

    python setup.py build_ext --inplace      # or: pip install --no-build-isolation .

kpack.build_flags() gives kpack's headers (and abseil's and CUDA's), libkpack and the C++
standard; c10_cuda is torch's CUDA stream and device-guard library.
"""

from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

import kpack

flags = kpack.build_flags()
setup(
    name="kpack_torch_example",
    ext_modules=[CppExtension("kpack_torch_example", ["kpack_torch_example.cpp"],
                              libraries=["c10_cuda"], **flags)],
    cmdclass={"build_ext": BuildExtension},
)
