"""Build-time tools for kpack: read CUDA cubins and write ``kpack/1`` and ``kpack/2`` packs
(the spec-driven builder, the recorder, and the builders of the repository's fixed packs).

Nothing here needs a GPU: Triton compiles cubins for any target without one, and
the cubin reader is pure Python.
"""

# The Triton versions whose specialization rules, kernel ABI and compile/launch internals
# the builder (kpack_tools.build) and the recorder (kpack_tools.record) reproduce; both
# refuse any other (the ABI they reproduce: docs/pack-format.md, include/kpack/arg.h).
SUPPORTED_TRITON_VERSIONS = ("3.6.0",)
