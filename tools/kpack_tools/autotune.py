"""Per-bucket autotuning for ``kpack_tools.build``: check every candidate, then time it.

For every bucket of a kernel spec:

1. **Candidates**: the spec's configs that ``config_allowed(representative,
   config)`` admits (all, without a predicate); the others are recorded as
   ``excluded``.
2. **Check**: each candidate runs once through Triton's JIT on a fresh copy of
   the inputs ``make_inputs`` builds for the bucket's representative shape, and
   every output (``outputs``) is compared with what it must be:

   - the spec's ``reference(args)``, within ``tolerance`` (rtol, atol) or,
     without one, ``DEFAULT_TOLERANCE`` for the output's dtype;
   - without a reference, the bucket's default config's outputs: bit for bit
     when the spec is ``deterministic``, else within the tolerance.

   A candidate that fails to run or disagrees is excluded and its error or
   mismatch recorded (``errors``, ``mismatches``).
3. **Time**: each candidate that passed: the median over ``reps`` launches, each
   timed alone with a pair of CUDA events after ``warmup`` untimed launches.
   The fastest wins.  A bucket where no candidate passes is a ``TuningError``:
   the build refuses it rather than pick a config that computes something else.

The timed kernels are Triton's JIT builds for those inputs; the pack's cubins
are compiled separately by ``triton.compile`` for the pack's target and
specializations (``kpack_tools.build``).

Running and timing go through a backend (``CudaBackend``: torch + a CUDA GPU),
so the selection logic can be exercised without a GPU.
"""

import statistics
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Collection, Dict, List, Mapping, Optional, Tuple

from kpack_tools.param_types import is_tensor_descriptor, parse_tensordesc
from kpack_tools.spec import Config, KernelSpec, describe_bucket

# (rtol, atol) per output dtype when the spec states no tolerance: what a different
# summation order or tile shape changes in a correct result, far below what a skipped
# or misplaced element changes.
DEFAULT_TOLERANCE = {
    "float64": (1e-9, 1e-12), "float32": (1e-4, 1e-5), "float16": (1e-2, 1e-3),
    "bfloat16": (5e-2, 1e-2),
}
# Integer and boolean outputs (and any dtype not listed) are compared exactly.
EXACT = (0.0, 0.0)


class TuningError(RuntimeError):
    """No candidate of a bucket passed the check (or the spec cannot be checked)."""


@dataclass
class BucketResult:
    """Tuning outcome of one bucket: median microseconds per config (None if the config
    did not run, disagreed or was excluded; ``errors``, ``mismatches``, ``excluded`` say
    why), what the outputs were checked against, and the chosen config's name."""

    index: Tuple[int, ...]
    representative: Mapping[str, int]
    chosen: str
    times_us: Dict[str, Optional[float]] = field(default_factory=dict)
    errors: Dict[str, str] = field(default_factory=dict)
    mismatches: Dict[str, str] = field(default_factory=dict)
    excluded: Dict[str, str] = field(default_factory=dict)
    checked_against: str = ""


def cuda_device() -> Tuple[Optional[str], str]:
    """``(device name, "")`` if torch sees a CUDA GPU, else ``(None, why not)``."""
    try:
        import torch
    except ImportError:
        return None, "torch is not installed"
    if not torch.cuda.is_available():
        return None, "torch sees no CUDA device"
    return torch.cuda.get_device_name(), ""


def jit_launcher(spec: KernelSpec, config, args: Mapping[str, object], fn=None,
                 grid=None, warm: bool = False) -> Callable:
    """A callable that launches ``fn`` (default: the spec's function) through
    Triton's JIT on ``args`` with ``config``; the grid is ``grid`` or else comes
    from the spec's grid expressions (launch values included), which it then
    needs. With ``warm`` it only compiles (``fn.warmup``), launching nothing."""
    fn = fn or spec.fn
    if grid is None and not spec.grid:
        raise TuningError(f"kernel '{spec.name}': the spec has no grid, so the builder cannot "
                          f"launch it; give `grid` (it may use `launch_values`)")
    if grid is None:
        grid = spec.grid_for(args, config)
    kwargs = {name: value for name, value in args.items() if name not in spec.launch_values}
    # A tensordesc parameter: the tensor make_inputs gave (or its TensorDescriptor) with the
    # config's block shape, as Triton's tutorials set it in a pre_hook.
    for name, param_type in spec.params_for(config):
        if name in spec.tensordesc_params:
            kwargs[name] = tensor_descriptor(kwargs[name], parse_tensordesc(param_type)[1])
    kwargs.update(spec.constexprs(config))
    kwargs.update(spec.options)
    kwargs.update(num_warps=config.num_warps, num_stages=config.num_stages,
                  num_ctas=config.num_ctas)
    if warm:
        return lambda: fn.warmup(grid=grid, **kwargs)
    return lambda: fn[grid](**kwargs)


def tensor_descriptor(value, block_shape):
    """A ``triton.tools.tensor_descriptor.TensorDescriptor`` with ``block_shape`` over
    ``value``: a tensor (the whole of it, as ``TensorDescriptor.from_tensor``) or a
    TensorDescriptor (its block shape replaced)."""
    import dataclasses

    from triton.tools.tensor_descriptor import TensorDescriptor
    if isinstance(value, TensorDescriptor):
        return dataclasses.replace(value, block_shape=list(block_shape))
    return TensorDescriptor.from_tensor(value, list(block_shape))


# Clock cycles the GPU spins before each timed launch (about 0.25 ms on an H200): longer
# than a Python launch takes to enqueue, so that the launch waits in the stream behind the
# spin and the events around it time the kernel, not the host's launch overhead.
_QUEUE_CYCLES = 500_000


def time_launch(launch: Callable, reps: int, warmup: int) -> float:
    """Median GPU time of one launch in microseconds (CUDA events). Each timed launch is
    queued behind a short GPU spin (``torch.cuda._sleep``), so that a kernel shorter than
    the host's launch overhead (Triton's JIT launch costs 13-40 us) is timed alone: with
    an idle GPU the start event would fire before the launch reached the stream."""
    import torch
    spin = getattr(torch.cuda, "_sleep", None)
    for _ in range(warmup):
        launch()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        if spin is not None:
            spin(_QUEUE_CYCLES)
        start.record()
        launch()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1000.0)
    return statistics.median(samples)


class CudaBackend:
    """Runs and times candidates through Triton's JIT on the current CUDA device."""

    def __init__(self, device: str):
        self.device = device

    def inputs(self, spec: KernelSpec, shape: Mapping[str, int]) -> Dict[str, Any]:
        return dict(spec.make_inputs(dict(shape), "cuda"))

    def copy(self, args: Mapping[str, Any]) -> Dict[str, Any]:
        """Fresh tensors for every tensor argument; a tensor descriptor (build-spec.md: a
        `make_inputs` value may be one) over a fresh copy of its tensor."""
        out = {}
        for k, v in args.items():
            if is_tensor_descriptor(v):
                out[k] = replace(v, base=v.base.clone())
            else:
                out[k] = v.clone() if hasattr(v, "clone") else v
        return out

    def run(self, spec: KernelSpec, config: Config, args: Mapping[str, Any],
            grid=None) -> None:
        import torch
        jit_launcher(spec, config, args, grid=grid)()
        torch.cuda.synchronize()

    def time(self, spec: KernelSpec, config: Config, args: Mapping[str, Any], reps: int,
             warmup: int, grid=None) -> float:
        return time_launch(jit_launcher(spec, config, args, grid=grid), reps, warmup)

    # For kpack_tools.grid_proof: tensors followed by guard memory of random bytes.
    GUARD_LIMIT_BYTES = 256 << 20

    def guard(self, args: Mapping[str, Any], factor: int, reach=None):
        """``(args, guards)``: each contiguous tensor argument copied into the front of a
        buffer whose rest, ``factor`` times the tensor's size or the size of the same
        argument in ``reach`` if larger (at most GUARD_LIMIT_BYTES), holds random bytes;
        ``guards`` lists (name, tail, its bytes) for guard_damage."""
        import torch
        guarded, guards = dict(args), []
        gen = torch.Generator(device="cuda").manual_seed(5)
        for name, value in args.items():
            if not isinstance(value, torch.Tensor) or not value.is_contiguous():
                continue
            n = value.numel()
            far = (reach or {}).get(name)
            want = max(n * factor, far.numel() if isinstance(far, torch.Tensor) else 0)
            extra = max(1, min(want, self.GUARD_LIMIT_BYTES // value.element_size()))
            big = torch.empty(n + extra, dtype=value.dtype, device=value.device)
            tail = big[n:].view(torch.uint8)
            tail.copy_(torch.randint(0, 256, tail.shape, dtype=torch.uint8, device=value.device,
                                     generator=gen))
            big[:n].copy_(value.reshape(-1))
            guarded[name] = big[:n].view(value.shape)
            guards.append((name, tail, tail.clone()))
        return guarded, guards

    def guard_damage(self, guards) -> List[str]:
        """The names whose guard memory changed since ``guard``."""
        import torch
        torch.cuda.synchronize()
        return [name for name, tail, pattern in guards if not torch.equal(tail, pattern)]


def cuda_backend() -> Tuple[Optional[CudaBackend], str]:
    """``(backend, "")`` with a usable CUDA GPU, else ``(None, why not)``."""
    device, why_not = cuda_device()
    return (CudaBackend(device), "") if device else (None, why_not)


def _dtype_name(value) -> str:
    return str(value.dtype).replace("torch.", "")


def _as_float64(value):
    """A flat float64 numpy array of a torch tensor or numpy array (bf16 included)."""
    import numpy as np
    if hasattr(value, "detach"):  # torch
        return value.detach().double().cpu().numpy().reshape(-1)
    return np.asarray(value, dtype=np.float64).reshape(-1)


def _bits(value):
    """The raw bytes of a torch tensor or numpy array, as a flat uint8 numpy array."""
    import numpy as np
    if hasattr(value, "detach"):
        import torch
        flat = value.detach().contiguous().reshape(-1)
        return flat.view(torch.uint8).cpu().numpy()
    return np.ascontiguousarray(value).reshape(-1).view(np.uint8)


def tolerance_for(spec: KernelSpec, output: str, value) -> Tuple[float, float]:
    """The spec's tolerance for ``output``, else ``DEFAULT_TOLERANCE`` for ``value``'s
    dtype."""
    tolerance = spec.tolerance
    if isinstance(tolerance, Mapping):
        tolerance = tolerance.get(output)
    if tolerance is not None:
        return tuple(tolerance)
    return DEFAULT_TOLERANCE.get(_dtype_name(value), EXACT)


def compare(name: str, got, want, tolerance: Optional[Tuple[float, float]]) -> Optional[str]:
    """None if output ``name`` matches, else a one-line description of the mismatch.
    ``tolerance`` None: bit for bit; else ``|got - want| <= atol + rtol * |want|``
    elementwise (NaN matches NaN). A tensor descriptor is compared by its tensor."""
    import numpy as np
    got = got.base if is_tensor_descriptor(got) else got
    want = want.base if is_tensor_descriptor(want) else want
    got_size = int(np.prod(getattr(got, "shape", ()) or (1,)))
    want_size = int(np.prod(getattr(want, "shape", ()) or (1,)))
    if got_size != want_size:
        return f"output '{name}': {got_size} elements, expected {want_size}"
    if tolerance is None:
        if _dtype_name(got) != _dtype_name(want):
            return f"output '{name}': dtype {_dtype_name(got)}, expected {_dtype_name(want)}"
        a, b = _bits(got), _bits(want)
        if np.array_equal(a, b):
            return None
        item = max(1, a.size // max(got_size, 1))
        differ = np.nonzero((a != b).reshape(-1, item).any(axis=1))[0]
        diff = np.abs(_as_float64(got) - _as_float64(want))
        return (f"output '{name}': {differ.size} of {got_size} elements differ bitwise from "
                f"the default config's (first at index {int(differ[0])}, max |diff| "
                f"{np.nanmax(diff):.3g})")
    rtol, atol = tolerance
    a, b = _as_float64(got), _as_float64(want)
    with np.errstate(invalid="ignore"):
        diff = np.abs(a - b)
        bad = ~((diff <= atol + rtol * np.abs(b)) | (np.isnan(a) & np.isnan(b)))
    if not bad.any():
        return None
    worst = int(np.nanargmax(np.where(bad, diff, -1.0))) if np.isfinite(diff[bad]).any() \
        else int(np.nonzero(bad)[0][0])
    return (f"output '{name}': {int(bad.sum())} of {a.size} elements outside rtol {rtol:g}, "
            f"atol {atol:g} (worst at index {worst}: {a[worst]:.6g}, expected {b[worst]:.6g})")


def _first_line(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0] if text else ''}"


def tune_kernel(spec: KernelSpec, backend, reps: int = 25, warmup: int = 3,
                log: Callable[[str], None] = print,
                only: Optional[Collection[Tuple[int, ...]]] = None) -> List[BucketResult]:
    """Check, then time, every candidate config on every bucket's representative shape
    (on the buckets ``only`` lists, in bucket order, when given). Raises ``TuningError``
    for a bucket where no candidate passes."""
    if not spec.grid:
        raise TuningError(f"kernel '{spec.name}': the spec has no grid, so the builder cannot "
                          f"launch it to tune; give `grid` (it may use `launch_values`)")
    if not spec.outputs:
        raise TuningError(f"kernel '{spec.name}': the spec names no `outputs`, so the tuner "
                          f"cannot check what a candidate computes; list the pointer "
                          f"parameters the kernel writes")
    results = []
    for number, (index, shape) in enumerate(zip(spec.bucket_indices(), spec.representatives)):
        if only is not None and index not in only:
            continue
        where = f"kernel '{spec.name}': bucket {list(index)} ({describe_bucket(spec, index)})"
        pristine = backend.inputs(spec, shape)
        missing = [name for name in list(spec.call_params) + list(spec.launch_values)
                   if name not in pristine]
        if missing:
            raise TuningError(f"kernel '{spec.name}': make_inputs({dict(shape)}) lacks "
                              f"{missing}")
        excluded = {c.name: "config_allowed is False for this bucket's representative shape"
                    for c in spec.configs if not spec.allowed(shape, c)}
        candidates = [c for c in spec.configs if c.name not in excluded]
        errors, mismatches = {}, {}

        # What every candidate's outputs must be.
        default = spec.default_config(number)
        if spec.reference is not None:
            expected = spec.reference(backend.copy(pristine))
            tolerances = {out: tolerance_for(spec, out, expected[out]) for out in spec.outputs}
            against = "reference, " + ", ".join(f"{out}: rtol {r:g} atol {a:g}"
                                                for out, (r, a) in tolerances.items())
        else:
            reference_args = backend.copy(pristine)
            try:
                backend.run(spec, default, reference_args)
            except Exception as err:  # noqa: BLE001 - nothing to compare against
                raise TuningError(f"{where}: the default config '{default.name}' (what the "
                                  f"candidates are checked against: the spec has no "
                                  f"reference) failed: {_first_line(err)}") from err
            expected = {out: reference_args[out] for out in spec.outputs}
            if spec.deterministic:
                tolerances = {out: None for out in spec.outputs}
                against = f"default config '{default.name}', bitwise"
            else:
                tolerances = {out: tolerance_for(spec, out, expected[out]) for out in spec.outputs}
                against = f"default config '{default.name}', " + ", ".join(
                    f"{out}: rtol {r:g} atol {a:g}" for out, (r, a) in tolerances.items())

        times: Dict[str, Optional[float]] = {c.name: None for c in spec.configs}
        for config in candidates:
            args = backend.copy(pristine)
            try:
                backend.run(spec, config, args)
            except Exception as err:  # noqa: BLE001 - a config that cannot run is recorded
                errors[config.name] = _first_line(err)
                continue
            problems = [p for p in (compare(out, args[out], expected[out], tolerances[out])
                                    for out in spec.outputs) if p]
            if problems:
                mismatches[config.name] = "; ".join(problems)
                continue
            try:
                times[config.name] = backend.time(spec, config, args, reps, warmup)
            except Exception as err:  # noqa: BLE001
                errors[config.name] = _first_line(err)
        ok = {name: t for name, t in times.items() if t is not None}
        if not ok:
            reasons = [f"'{name}': {why}" for kind in (excluded, errors, mismatches)
                       for name, why in kind.items()]
            raise TuningError(f"{where}, shape {dict(shape)}: no candidate config passed the "
                              f"check against the {against}: " + "; ".join(reasons))
        chosen = min(ok, key=ok.get)
        results.append(BucketResult(index, dict(shape), chosen, times, errors, mismatches,
                                    excluded, against))
        table = "  ".join(
            f"{name}={f'{t:.1f}us' if t is not None else 'excluded' if name in excluded else 'WRONG' if name in mismatches else 'fail'}"
            for name, t in times.items())
        log(f"tune {where}, shape {dict(shape)}: {table} -> {chosen}")
        for name, text in mismatches.items():
            log(f"  excluded '{name}': {text}")
    return results
