"""Proving on the GPU that a kernel tolerates a larger grid (``kpack_tools.build``).

A spec with ``grid_tolerant=True`` says the kernel's programs tolerate a grid larger than
its grid expressions give: every program past the last useful one masks itself out by
the size arguments.  A CUDA graph (``kpack::StepGraph``) then launches the kernel with
the grid evaluated at its bucket's upper edge, so that while sizes stay inside a bucket
only the arguments change (docs/pack-format.md, "Grid tolerance").  The builder does not
take the spec's word for it when it has a GPU.  For every bucket, with the config the
pack uses there:

1. **Shapes across the bucket**: the representative shape with each bucket parameter at
   the bucket's lowest value and at its middle (the highest needs no padding), and the
   representative itself.  The *padded grid* of a shape is the grid with each bucket
   parameter at the bucket's upper edge (the spec's ``grid_max`` for the open-ended last
   bucket; without one that bucket keeps exact grids and is not padded).  The values a
   graph pads are those of kpack's own rule, ``PaddingInterval`` in src/graph/graph_grid.h,
   called through the extension (``kpack._kpack.graph_padding``): one rule, so what is
   proven here is what graphs pad.  It starts the first bucket at 1: a size below 1 is
   empty work, which an eager call launches nothing for, and graphs keep exact (empty)
   grids there.  Besides, on the
   representative, every axis of the exact grid doubled: a grid the kernel must tolerate
   too, also in a bucket that is never padded.
2. **Check**: the kernel runs through Triton's JIT once at the exact and once at the
   larger grid, each on a fresh copy of ``make_inputs(shape)`` whose tensors are followed
   by *guard* memory holding random bytes (as long as the tensor at the padded shape, and
   at least the tensor times the ratio of programs).  Every tensor argument must come out bitwise
   identical, and every guard untouched (a program that does not mask itself writes past
   its tensors: e.g. one program per row with no row check).  A launch that fails, a
   difference or a damaged guard refuses the flag.
3. **Cost**: both grids are timed (median of ``reps`` launches between CUDA events); the
   worst padded/exact ratio over all buckets must be at most ``grid_cost_limit``, or the
   kernel keeps exact grids (extra programs that do the full work instead of returning
   early, as in Triton's tutorial matmul, can multiply the time).

The verdict goes to ``tuning.json`` (``grid_tolerance``, per kernel) and decides the
manifest: ``{"proof": "gpu"}`` when proven, nothing when refused or too costly.  Without a
GPU (``--no-tune``, or no torch) nothing can be checked: the spec's assertion is written
as ``{"proof": "asserted"}`` and the build says it is unproven.

Running goes through the tuner's backend (``kpack_tools.autotune.CudaBackend``), so the
logic is exercised on the CPU with a model backend (tools/tests/test_grid_proof.py).
"""

import math
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from kpack_tools.autotune import compare
from kpack_tools.spec import Config, KernelSpec, describe_bucket

# Verdicts, as tuning.json spells them.
PROVEN = "proven"
UNPROVEN = "unproven"
REFUSED = "refused"
TOO_COSTLY = "too costly"


def bucket_bounds(spec: KernelSpec, index: Sequence[int]) -> List[Optional[Tuple[int, int]]]:
    """Per bucket dim, the (lowest, highest) value of bucket ``index`` that step graphs pad
    to its highest; None where they keep exact grids (an open-ended last interval without
    a ``grid_max``, a first interval below 1).  kpack's C++ rule decides, through the
    extension."""
    try:
        from kpack._kpack import graph_padding  # pylint: disable=import-outside-toplevel
    except ImportError as e:
        raise RuntimeError(
            "the grid-tolerance proof (a spec with grid_tolerance) needs kpack's padding rule "
            "from the installed kpack package (pip install .): " + str(e)) from e

    return [graph_padding([int(e) for e in dim.edges], spec.grid_max.get(dim.param), int(i))
            for dim, i in zip(spec.buckets, index)]


def padded_values(spec: KernelSpec, index: Sequence[int]) -> Dict[str, int]:
    """The bucket parameters' values the padded grid of bucket ``index`` is evaluated at."""
    return {dim.param: bound[1] for dim, bound in zip(spec.buckets, bucket_bounds(spec, index))
            if bound is not None}


def shapes_across(spec: KernelSpec, index: Sequence[int],
                  representative: Mapping[str, int]) -> List[Dict[str, int]]:
    """The shapes a bucket is checked and timed on: each padded bucket parameter at its
    lowest and at its middle value (others as in the representative), then the
    representative; duplicates dropped."""
    bounds = bucket_bounds(spec, index)
    shapes = []
    for pick in (lambda lo, hi: lo, lambda lo, hi: (lo + hi) // 2):
        shape = dict(representative)
        for dim, bound in zip(spec.buckets, bounds):
            if bound is not None:
                shape[dim.param] = pick(*bound)
        shapes.append(shape)
    shapes.append(dict(representative))
    unique = []
    for shape in shapes:
        if shape not in unique:
            unique.append(shape)
    return unique


def _programs(grid: Sequence[int]) -> int:
    return math.prod(grid) if grid else 1


def _check_launches(spec: KernelSpec, config: Config, backend, shape, pristine, exact, larger,
                    times: bool, reps: int, warmup: int, reach=None) -> Dict[str, Any]:
    """One shape: the kernel at the exact and at the larger grid on guarded copies of the
    inputs ``pristine``; the tensor arguments compared bitwise, the guards checked, both
    timed. Each tensor's guard is as long as the tensor times the programs' ratio, and at
    least as long as the same tensor of ``reach`` (the inputs at the padded shape, which
    the extra programs would cover if they did not mask themselves out)."""
    factor = max(1, math.ceil(_programs(larger) / max(1, _programs(exact))))
    result = {"shape": dict(shape), "grid": list(exact), "larger_grid": list(larger),
              "exact_us": None, "larger_us": None, "problem": None}
    runs = {}
    for which, grid in (("exact", exact), ("larger", larger)):
        args, guards = backend.guard(backend.copy(pristine), factor, reach)
        try:
            backend.run(spec, config, args, grid=tuple(grid))
        except Exception as err:  # noqa: BLE001 - recorded as the refusal's reason
            text = str(err).strip().splitlines()
            result["problem"] = (f"the launch at the {which} grid {list(grid)} failed: "
                                 f"{type(err).__name__}: {text[0] if text else ''}")
            return result
        damaged = backend.guard_damage(guards)
        if damaged:
            result["problem"] = (f"at the {which} grid {list(grid)} the kernel wrote past "
                                 f"{', '.join(repr(n) for n in damaged)} (guard memory after "
                                 f"the tensor changed): programs past the exact grid do not "
                                 f"mask themselves out")
            return result
        runs[which] = args
    for name, value in runs["exact"].items():
        if not hasattr(value, "shape") or name in spec.launch_values:
            continue
        problem = compare(name, runs["larger"][name], value, None)
        if problem:
            result["problem"] = (f"the grid {list(larger)} computed other bits than the exact "
                                 f"{list(exact)}: {problem.replace('the default config', 'the exact grid')}")
            return result
    if times:
        result["exact_us"] = backend.time(spec, config, runs["exact"], reps, warmup,
                                          grid=tuple(exact))
        result["larger_us"] = backend.time(spec, config, runs["larger"], reps, warmup,
                                           grid=tuple(larger))
    return result


def prove(spec: KernelSpec, configs: Sequence[Config], backend, reps: int = 25,
          warmup: int = 3, log: Callable[[str], None] = print) -> Dict[str, Any]:
    """Check and time ``spec``'s grid tolerance with the pack's config of every bucket
    (``configs``, bucket order). Returns the tuning.json entry: ``verdict`` (PROVEN,
    REFUSED or TOO_COSTLY), ``reason``, ``cost_limit``, ``max_cost`` and per bucket the
    shapes checked."""
    entry = {"asserted": True, "verdict": PROVEN, "reason": None,
             "cost_limit": spec.grid_cost_limit, "max_cost": None,
             "configs": [c.name for c in configs], "grid": list(spec.grid or []),
             "buckets": []}
    worst = None
    for index, representative, config in zip(spec.bucket_indices(), spec.representatives,
                                             configs):
        where = f"kernel '{spec.name}': bucket {list(index)} ({describe_bucket(spec, index)})"
        padding = padded_values(spec, index)
        bucket = {"bucket": list(index), "range": describe_bucket(spec, index),
                  "config": config.name, "padded_to": padding or None, "shapes": []}
        entry["buckets"].append(bucket)
        checks = []
        for shape in shapes_across(spec, index, representative):
            args = backend.inputs(spec, shape)
            exact = spec.grid_for(args, config)
            padded = spec.grid_for({**args, **padding}, config)
            if padding and tuple(padded) != tuple(exact):
                reach = backend.inputs(spec, {**shape, **padding})
                checks.append((shape, args, exact, padded, True, reach))
        args = backend.inputs(spec, representative)
        exact = spec.grid_for(args, config)
        checks.append((dict(representative), args, exact, tuple(2 * g for g in exact), False,
                       None))
        for shape, pristine, exact, larger, timed, reach in checks:
            if any(g < 0 for g in larger) or any(a > b for a, b in zip(exact, larger)):
                result = {"shape": dict(shape), "grid": list(exact), "larger_grid": list(larger),
                          "exact_us": None, "larger_us": None,
                          "problem": f"the padded grid {list(larger)} is smaller than the exact "
                                     f"{list(exact)} on some axis: the grid expressions do not "
                                     f"grow with the bucket parameters"}
            elif _programs(exact) == 0:
                continue
            else:
                result = _check_launches(spec, config, backend, shape, pristine, exact, larger,
                                         timed, reps, warmup, reach)
            bucket["shapes"].append(result)
            if result["problem"]:
                entry["verdict"], entry["reason"] = REFUSED, f"{where}, shape {shape}: " \
                                                             f"{result['problem']}"
                log(f"grid tolerance REFUSED for {where}: {result['problem']}")
                return entry
            if timed and result["exact_us"]:
                ratio = result["larger_us"] / result["exact_us"]
                result["cost"] = round(ratio, 4)
                if worst is None or ratio > worst:
                    worst = ratio
        log(f"grid tolerance {where}: {len(bucket['shapes'])} shape(s), padded and exact "
            f"grids bit-identical"
            + (f", padded to {padding}" if padding else ", not padded (open-ended)"))
    entry["max_cost"] = None if worst is None else round(worst, 4)
    if worst is not None and worst > spec.grid_cost_limit:
        entry["verdict"] = TOO_COSTLY
        entry["reason"] = (f"padded grids cost up to {worst:.2f}x the exact grids' GPU time, "
                           f"above the spec's grid_cost_limit {spec.grid_cost_limit}: the "
                           f"kernel keeps exact grids")
        log(f"grid tolerance of kernel '{spec.name}' not used: {entry['reason']}")
    return entry


def changed_since(spec: KernelSpec, entry: Mapping[str, Any]) -> Optional[str]:
    """What of ``spec`` that a verdict depends on differs from what ``entry`` (a reused
    tuning.json's verdict) was reached with, or None: the cost limit, the values each
    bucket pads to (its edges and grid_max), and the grid expressions (when recorded)."""
    if entry.get("cost_limit") != spec.grid_cost_limit:
        return (f"the spec's grid_cost_limit changed ({entry.get('cost_limit')} to "
                f"{spec.grid_cost_limit})")
    padded = [padded_values(spec, index) or None for index in spec.bucket_indices()]
    recorded = [b.get("padded_to") for b in entry.get("buckets", [])]
    # A refusal stops at its bucket: the buckets up to it are what it was reached with.
    if recorded != padded[:len(recorded)] or (entry.get("verdict") != REFUSED
                                              and len(recorded) != len(padded)):
        return "the values the buckets pad to changed (bucket edges or grid_max)"
    if "grid" in entry and entry["grid"] != list(spec.grid or []):
        return f"the grid expressions changed ({entry['grid']} to {list(spec.grid or [])})"
    return None


def unproven(spec: KernelSpec, why: str) -> Dict[str, Any]:
    """The tuning.json entry of an asserted tolerance that nothing checked."""
    return {"asserted": True, "verdict": UNPROVEN,
            "reason": f"asserted by the spec, unproven: {why}", "cost_limit": spec.grid_cost_limit,
            "max_cost": None, "configs": None, "buckets": []}


def manifest_field(spec: KernelSpec, entry: Optional[Mapping[str, Any]]) -> Optional[Dict]:
    """The manifest's ``grid_tolerance`` for a verdict: proof "gpu" when proven,
    "asserted" when unproven, absent otherwise."""
    if entry is None or entry["verdict"] not in (PROVEN, UNPROVEN):
        return None
    field = {"proof": "gpu" if entry["verdict"] == PROVEN else "asserted"}
    if spec.grid_max:
        field["max"] = dict(spec.grid_max)
    return field
