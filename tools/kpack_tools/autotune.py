"""Per-bucket autotuning for ``kpack_tools.build`` (needs torch and a CUDA GPU).

For every bucket of a kernel spec, each candidate config runs through Triton's
JIT on the inputs the spec's ``make_inputs`` builds for the bucket's
representative shape, with the config's constexprs, ``num_warps``,
``num_stages`` and ``num_ctas``.  A config's time is the median over ``reps``
launches, each timed alone with a pair of CUDA events after ``warmup``
untimed launches (the first of which compiles).  The fastest config wins.  A
config that fails to compile or launch (e.g. too much shared memory) gets no
time and its error is recorded; a bucket where every config fails is an error.

The timed kernels are Triton's JIT builds for those inputs; the pack's cubins
are compiled separately by ``triton.compile`` for the pack's target and
specializations (``kpack_tools.build``).
"""

import statistics
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Tuple

from kpack_tools.spec import KernelSpec, describe_bucket


@dataclass
class BucketResult:
    """Tuning outcome of one bucket: median microseconds per config (None if
    the config failed; ``errors`` says why) and the chosen config's name."""

    index: Tuple[int, ...]
    representative: Mapping[str, int]
    chosen: str
    times_us: Dict[str, Optional[float]] = field(default_factory=dict)
    errors: Dict[str, str] = field(default_factory=dict)


def cuda_device() -> Tuple[Optional[str], str]:
    """``(device name, "")`` if torch sees a CUDA GPU, else ``(None, why not)``."""
    try:
        import torch
    except ImportError:
        return None, "torch is not installed"
    if not torch.cuda.is_available():
        return None, "torch sees no CUDA device"
    return torch.cuda.get_device_name(), ""


def jit_launcher(spec: KernelSpec, config, args: Mapping[str, object], fn=None) -> Callable:
    """A callable that launches ``fn`` (default: the spec's function) through
    Triton's JIT on ``args`` with ``config``; the grid comes from the spec's
    grid expressions."""
    fn = fn or spec.fn
    grid = spec.grid_for(args, config)
    kwargs = dict(args)
    kwargs.update(spec.constexprs(config))
    kwargs.update(spec.options)
    kwargs.update(num_warps=config.num_warps, num_stages=config.num_stages,
                  num_ctas=config.num_ctas)
    return lambda: fn[grid](**kwargs)


def time_launch(launch: Callable, reps: int, warmup: int) -> float:
    """Median GPU time of one launch in microseconds (CUDA events)."""
    import torch
    for _ in range(warmup):
        launch()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        launch()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1000.0)
    return statistics.median(samples)


def tune_kernel(spec: KernelSpec, reps: int = 25, warmup: int = 3,
                log: Callable[[str], None] = print) -> List[BucketResult]:
    """Time every config on every bucket's representative shape."""
    results = []
    for index, shape in zip(spec.bucket_indices(), spec.representatives):
        args = spec.make_inputs(dict(shape), "cuda")
        missing = [name for name in spec.call_params if name not in args]
        if missing:
            raise ValueError(f"kernel '{spec.name}': make_inputs({dict(shape)}) lacks "
                             f"call parameter(s) {missing}")
        times, errors = {}, {}
        for config in spec.configs:
            try:
                times[config.name] = time_launch(jit_launcher(spec, config, args), reps, warmup)
            except Exception as err:  # a config that cannot run is recorded, not fatal
                times[config.name] = None
                errors[config.name] = f"{type(err).__name__}: {str(err).splitlines()[0]}"
        ok = {name: t for name, t in times.items() if t is not None}
        if not ok:
            raise RuntimeError(f"kernel '{spec.name}': bucket {list(index)}: every config "
                               f"failed: {errors}")
        chosen = min(ok, key=ok.get)
        results.append(BucketResult(index, dict(shape), chosen, times, errors))
        table = "  ".join(f"{name}={'fail' if t is None else f'{t:.1f}us'}"
                          for name, t in times.items())
        log(f"tune {spec.name} bucket {list(index)} ({describe_bucket(spec, index)}, "
            f"shape {dict(shape)}): {table} -> {chosen}")
    return results
