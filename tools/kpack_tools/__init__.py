"""Build-time tools for kpack: read CUDA cubins and write ``kpack/1`` packs.

Nothing here needs a GPU: Triton compiles cubins for any target without one, and
the cubin reader is pure Python.
"""
