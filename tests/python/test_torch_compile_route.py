"""kpack.torch.install under torch.compile, traced without a GPU: the installed Triton
calls that the pack serves become kpack torch ops in Dynamo's graph (the rest stay
Dynamo's own triton_kernel_wrapper_mutation, with a DropInWarning).

Needs torch (not in the CI venv, where this file is skipped as a whole; it runs wherever
torch is installed, e.g. a developer's venv). Dynamo handles Triton calls only where
torch.utils._triton.has_triton() holds, which asks for a GPU: the test says it does, and
traces with a backend that keeps the graph and runs nothing, so no kernel executes.
The GPU check (tests/gpu/torch_ops_check.py, section dynamo) runs the same on the H200.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings

import pytest
import triton

import kpack
import kpack.torch

from conftest import KERNELS

if importlib.util.find_spec("torch") is None:
    pytest.skip("needs torch (not imported at collection: other tests check kpack does not "
                "import it)", allow_module_level=True)

sys.path.insert(0, str(KERNELS / "examples"))
from matmul import matmul_kernel  # noqa: E402
from vector_add import vector_add_kernel  # noqa: E402

torch = None  # imported by the fixture


@pytest.fixture
def traced(monkeypatch, open_pack):
    global torch
    import torch  # noqa: PLC0415
    import torch.utils._triton as triton_utils  # noqa: PLC0415
    monkeypatch.setattr(triton_utils, "has_triton", lambda: True)
    monkeypatch.setattr(triton_utils, "has_triton_package", lambda: True)
    pack = open_pack("examplepack")  # one Pack for the session: one op namespace
    kpack.torch.install(pack, namespace="kpack_route_test")
    graphs = []

    def trace(fn, *args, dynamic=False):
        def backend(gm, example_inputs):
            graphs.append(gm.graph)
            return lambda *a: None  # traced, never run
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend=backend, fullgraph=True, dynamic=dynamic)
        try:
            compiled(*args)
        except TypeError:
            pass  # the dummy compiled function returns None for the outputs
        return [str(n.target) for n in graphs[-1].nodes if n.op == "call_function"]
    yield trace
    kpack.torch.uninstall()


def step(x, y, a, b):
    out = torch.empty_like(x)
    vector_add_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, out, x.numel(), BLOCK=1024)
    m, k = a.shape
    n = b.shape[1]
    c = torch.empty((m, n), dtype=a.dtype)
    matmul_kernel[lambda meta: (triton.cdiv(m, meta["BLOCK_M"]), triton.cdiv(n, meta["BLOCK_N"]))](
        a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
        c.stride(1), BLOCK_M=64, BLOCK_N=64, BLOCK_K=32)
    return out, c


@pytest.mark.parametrize("dynamic", [False, True])
def test_served_calls_become_kpack_ops(traced, dynamic):
    x = torch.randn(4096)
    a, b = torch.randn(100, 64).half(), torch.randn(64, 32).half()
    targets = traced(step, x, x, a, b, dynamic=dynamic)
    assert "kpack_route_test.vector_add.default" in targets
    # matmul with the 64 x 64 configuration: an op for exactly those variants.
    views = [t for t in targets if t.startswith("kpack_route_test.matmul_fp16__v")]
    assert len(views) == 1, targets
    assert not any("triton_kernel_wrapper" in t for t in targets), targets
    op = getattr(torch.ops.kpack_route_test, views[0].split(".")[1])
    assert "Tensor(a!) c_ptr" in str(op.default._schema)


def test_calls_the_pack_cannot_serve_stay_dynamos(traced):
    def other_block(x, y):
        out = torch.empty_like(x)
        vector_add_kernel[(1,)](x, y, out, x.numel(), BLOCK=2048)
        return out
    x = torch.randn(4096)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        targets = traced(other_block, x, x)
    assert any("triton_kernel_wrapper_mutation" in t for t in targets), targets
    assert any(issubclass(w.category, kpack.DropInWarning) and "Inductor compiles it" in
               str(w.message) and "BLOCK=2048" in str(w.message) for w in caught)
