"""The example kernels specified for a CUDA graph step (``kpack::StepGraph``).

``kernels/graphpack`` is built from this file (``--no-tune``); ``bench/graph_bench`` and
the graph conformance tests run a step of these four kernels whose sizes change inside
their buckets every step. The kernels are the examples' own (``vector_add.py``,
``matmul.py``, ``softmax.py``, ``layer_norm.py``); only the buckets and the grid
tolerance differ:

- ``vector_add``: ``n`` bucketed at 4096, 65536 and 2^20 (the example has no buckets, so
  every ``n`` would be its own grid); ``grid_tolerant``: every program masks by ``n``.
- ``matmul_fp16``: ``M`` bucketed as the example (1-16, 17-64, 65-256, 257+);
  ``grid_tolerant``: rows are masked by ``M`` and columns by ``N`` (the extra programs'
  masked loads and dot products still run: on a GPU the builder's cost check decides;
  built ``--no-tune`` it is asserted, unproven). The open-ended last bucket keeps exact
  grids (no ``grid_max``).
- ``softmax``: the example unchanged (``n_cols`` bucketed). Not grid-tolerant: one
  program per row with no row check, so a larger grid would write past the output.
- ``layer_norm``: ``N`` bucketed at 1024 and 4096; not grid-tolerant for the same reason.
"""

import dataclasses
from pathlib import Path

from kpack_tools.spec import Bucket, load_specs

HERE = Path(__file__).resolve().parent


def _spec(file, name):
    return next(s for s in load_specs(HERE / file) if s.name == name)


KPACK_KERNELS = [
    dataclasses.replace(
        _spec("vector_add.py", "vector_add"),
        buckets=[Bucket("n", [4096, 65536, 1 << 20])],
        representatives=[{"n": 4096}, {"n": 65536}, {"n": 1 << 20}, {"n": 1 << 22}],
        grid_tolerant=True),
    dataclasses.replace(_spec("matmul.py", "matmul_fp16"), grid_tolerant=True),
    _spec("softmax.py", "softmax"),
    dataclasses.replace(
        _spec("layer_norm.py", "layer_norm"),
        buckets=[Bucket("N", [1024, 4096])],
        representatives=[{"M": 4096, "N": 1024}, {"M": 4096, "N": 4096},
                         {"M": 4096, "N": 8192}]),
]
