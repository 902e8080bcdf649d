"""The example-pack cases the Python GPU checks share (python_check.py, torch_ops_check.py):
for every kernel of kernels/examplepack and every shape of examples_check.SHAPES (each
bucket, aligned and not), the inputs, the call arguments, the variant kpack must pick, and
the outputs of Triton's JIT running the same kernel, config and specialization -- which a
kpack launch must match bit for bit (examples_check explains why that is exact).

The example modules are imported as top-level modules (``vector_add``, ``matmul``, ...),
as a program imports its kernel module, so that their ``@triton.jit`` functions are the
ones kpack.install recognizes by the pack's ``source``.
"""

import importlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

EXAMPLE_MODULES = ("vector_add", "softmax", "layer_norm", "matmul", "layer_norm_train",
                   "matmul_tma", "attention_tma")
SKIP = 77


def skip_or_fail(reason):
    """Exit code 77 (skipped) for a machine without torch or a GPU, unless
    KPACK_REQUIRE_GPU=1 (then 1)."""
    print(f"SKIPPED: {reason}")
    return 1 if os.environ.get("KPACK_REQUIRE_GPU") == "1" else SKIP


def import_stack(repo: Path):
    """(torch, triton, kpack), or the exit code when one is missing or there is no GPU."""
    try:
        import torch
        import triton
    except ImportError as e:
        return skip_or_fail(f"cannot import torch/triton: {e}")
    if not torch.cuda.is_available():
        return skip_or_fail("torch sees no CUDA device")
    try:
        import kpack
        import kpack.torch  # noqa: F401
    except ImportError as e:
        print(f"FAILED: cannot import kpack ({e}); install it into {sys.executable} with "
              f"`pip install --no-build-isolation {repo}`")
        return 1
    print(f"kpack {kpack.__file__}, triton {triton.__version__}, torch {torch.__version__}, "
          f"{torch.cuda.get_device_name()}")
    return torch, triton, kpack


@dataclass
class Case:
    name: str            # pack kernel
    spec: Any            # its KernelSpec (kernels/examples)
    shape: Dict[str, int]
    args: Dict[str, Any]  # every spec argument by name (outputs included)
    call: List[Any]      # the kpack call arguments, in order
    want: str            # the variant kpack must select
    config: Any          # the tuned config of the case's bucket
    grid: Optional[tuple]  # for kernels without grid expressions: the spec's grid
    expected: Dict[str, Any]  # output name -> Triton JIT's output

    def reset_outputs(self, value=float("nan")):
        for out in self.spec.outputs:
            self.args[out].fill_(value)


def load(repo: Path):
    """(pack directory, {kernel name: spec}, {(kernel, bucket): tuned config name}) with
    the example modules importable and the tools on sys.path."""
    for path in (repo / "tools", repo / "tests" / "gpu", repo / "kernels" / "examples"):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    specs = {}
    for module in EXAMPLE_MODULES:
        for spec in importlib.import_module(module).KPACK_KERNELS:
            specs[spec.name] = spec
    pack_dir = repo / "kernels" / "examplepack"
    tuning = json.loads((pack_dir / "tuning.json").read_text())
    chosen = {(k["name"], tuple(b["bucket"])): b["chosen"]
              for k in tuning["kernels"] for b in k["buckets"]}
    return pack_dir, specs, chosen


def cases(pack, specs, chosen, names=None):
    """Every case, with Triton's JIT outputs computed (on the current stream, synced)."""
    import torch
    import triton
    import examples_check as ec
    from kpack_tools import build as builder
    from kpack_tools.autotune import jit_launcher, tensor_descriptor
    from kpack_tools.pack import parse_tensordesc

    for name, shapes in ec.SHAPES.items():
        if names is not None and name not in names:
            continue
        spec = specs[name]
        for shape, _ in shapes:
            args = spec.make_inputs(shape, "cuda")
            index = spec.bucket_of(args)
            special = ec.expected_variant(spec, args)
            config = spec.config(chosen[(name, index)])
            # A tensordesc parameter takes Triton's TensorDescriptor over the tensor (its
            # block shape is the config's, as Triton needs; kpack does not read it).
            types = dict(spec.params_for(config))
            call = [tensor_descriptor(args[p], parse_tensordesc(types[p])[1])
                    if p in spec.tensordesc_params else args[p] for p in spec.call_params]
            # Triton's JIT, specialized exactly like the variant.
            assumed = set(special.div16) | set(special.eq1)
            jit_fn = triton.JITFunction(spec.fn.fn, do_not_specialize=[
                p for p in spec.call_params if p not in assumed])
            for out in spec.outputs:
                args[out].zero_()
            jit_launcher(spec, config, args, fn=jit_fn)()
            torch.cuda.synchronize()
            expected = {out: args[out].clone() for out in spec.outputs}
            grid = None if pack[name].grid else tuple(spec.grid_for(args, config))
            yield Case(name, spec, shape, args, call,
                       builder.variant_name(spec, index, special), config, grid, expected)


def bits(t):
    import examples_check as ec
    return ec.bits(t)


def same_bits(a, b) -> bool:
    import torch
    return torch.equal(bits(a), bits(b))
