"""Build specs for ``kpack_tools.build`` (format: ``docs/build-spec.md``).

A spec file is a Python module that defines ``KPACK_KERNELS``, a list of
``KernelSpec``.  Each names a ``@triton.jit`` function, the pack kernel's
parameters with their Triton types, the candidate configs, the bucket dims
with one representative shape per bucket, the specializations to emit and a
grid expression; and an input factory the autotuner times the configs on.

``check_spec`` validates a spec completely before anything is compiled, so a
mistake is a ``SpecError`` naming the kernel and the field, not a Triton
traceback or a pack the runtime refuses.
"""

import importlib.util
import itertools
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, List, Mapping, Optional, Sequence, Tuple

from kpack_tools.grid_expr import (check_grid_expression, evaluate_grid_expression, grid_names,
                                   parse_grid_expression)
from kpack_tools.pack_dispatch import describe_bucket_index
from kpack_tools.param_types import INTEGER_TYPES, is_tensordesc, slot_size, tensordesc_type

GENERIC = "generic"
# Spec files are imported under a unique module name; a kernel's source qualname uses
# the file's stem instead (``source_qualname``).
SPEC_MODULE_PREFIX = "_kpack_spec_"
SPEC_MODULE_STEMS = {}


class SpecError(ValueError):
    """A build spec is wrong; the message names the spec, kernel and field."""


# A spec's tensordesc type may name constexprs in its block shape:
# ``tensordesc<fp16[BLOCK_M, BLOCK_K]>`` is resolved per config.
_SPEC_TENSORDESC = re.compile(r"tensordesc<([A-Za-z0-9_]+)\[([A-Za-z0-9_, ]*)\]>")


def resolve_type(param_type: str, constexprs: Mapping[str, Any]) -> str:
    """``param_type`` with the constexpr names of a tensordesc block shape replaced by their
    values in ``constexprs`` (other types are returned as they are). ValueError when a
    name is not an integer constexpr."""
    if not is_tensordesc(param_type):
        return param_type
    match = _SPEC_TENSORDESC.fullmatch(param_type)
    if match is None:
        raise ValueError(f"'{param_type}' is not a tensordesc<DTYPE[B0, ...]> type")
    block = []
    for dim in (d.strip() for d in match.group(2).split(",")):
        if dim.isdigit():
            block.append(int(dim))
            continue
        value = constexprs.get(dim)
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"'{param_type}': block dimension '{dim}' is not an integer "
                             f"constexpr of the config (got {value!r})")
        block.append(value)
    return tensordesc_type(match.group(1), block)


@dataclass(frozen=True)
class Config:
    """One candidate config: the tuned constexprs and Triton's launch options."""

    name: str
    constexprs: Mapping[str, Any]
    num_warps: int = 4
    num_stages: int = 3
    num_ctas: int = 1


@dataclass(frozen=True)
class Bucket:
    """A bucket dim: an integer call parameter and inclusive upper edges."""

    param: str
    edges: Sequence[int]


@dataclass(frozen=True)
class Specialization:
    """A specialization to emit besides the generic variant.

    ``div16``: pointers whose address / integers whose value the variant
    assumes divisible by 16 (Triton's ``tt.divisibility = 16``); ``eq1``:
    integers the variant assumes equal to 1 (compiled away, as Triton's JIT
    does with an int argument equal to 1).
    """

    name: str
    div16: Sequence[str] = ()
    eq1: Sequence[str] = ()


@dataclass(frozen=True)
class KernelSpec:
    """One pack kernel.  See ``docs/build-spec.md`` for every field.

    ``make_inputs(shape, device)`` returns ``{call parameter: value}`` (torch
    tensors for pointers), plus the ``launch_values``, for a representative
    shape; ``reference(args)`` returns ``{output parameter: expected tensor}``
    and ``outputs`` names the pointer parameters a launch writes.  The tuner
    compares every candidate's outputs with the reference (or, without one,
    with the bucket's default config) before timing it.
    """

    name: str
    fn: Any
    params: Sequence[Tuple[str, str]]
    configs: Sequence[Config]
    default: Any  # a config name, or one config name per bucket
    make_inputs: Callable[[Mapping[str, int], Any], Mapping[str, Any]]
    representatives: Sequence[Mapping[str, int]]
    grid: Sequence[str] = ()
    buckets: Sequence[Bucket] = ()
    specializations: Sequence[Specialization] = ()
    constants: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    outputs: Sequence[str] = ()
    reference: Optional[Callable[[Mapping[str, Any]], Mapping[str, Any]]] = None
    # Values make_inputs returns besides the call parameters, for grid expressions that
    # the builder's own launches evaluate (e.g. n_rows = X.shape[0]); a grid that names
    # one is not written to the manifest (callers pass the grid).
    launch_values: Sequence[str] = ()
    # How candidates' outputs are compared: (rtol, atol) against the reference, or
    # against the default config when there is no reference and the kernel is not
    # deterministic; or {output: (rtol, atol)}; an output without one gets
    # kpack_tools.autotune.DEFAULT_TOLERANCE for its dtype.
    tolerance: Any = None
    # Bitwise comparison with the default config (when there is no reference): the
    # kernel computes the same bits whatever the config (e.g. no reductions).
    deterministic: bool = False
    # config_allowed(representative shape, config) -> bool: False excludes the config
    # from the bucket (e.g. a BLOCK smaller than the row).
    config_allowed: Optional[Callable[[Mapping[str, int], Config], bool]] = None
    # Pointer parameters the kernel never writes through (manifest `readonly`).
    readonly: Sequence[str] = ()
    # The kernel's programs tolerate a larger grid than its grid expressions give (every
    # program past the last useful one masks itself out by the size arguments), so a CUDA
    # graph may launch it with the grid of its bucket's upper edge (manifest
    # `grid_tolerance`). The builder proves it on a GPU; without one it is written as
    # asserted (docs/build-spec.md).
    grid_tolerant: bool = False
    # {bucket parameter: value}: what the open-ended last bucket is padded to (> last edge).
    grid_max: Mapping[str, int] = field(default_factory=dict)
    # The largest padded/exact GPU time ratio the builder accepts (worst shape of any
    # bucket); above it the kernel keeps exact grids.
    grid_cost_limit: float = 1.25

    def params_for(self, config: "Config") -> List[Tuple[str, str]]:
        """``params`` with tensordesc block shapes resolved for ``config``."""
        constexprs = self.constexprs(config)
        return [(name, resolve_type(t, constexprs)) for name, t in self.params]

    @property
    def tensordesc_params(self) -> List[str]:
        return [name for name, t in self.params if is_tensordesc(t)]

    @property
    def call_params(self) -> List[str]:
        return [name for name, t in self.params if t != "constexpr"]

    @property
    def constexpr_params(self) -> List[str]:
        return [name for name, t in self.params if t == "constexpr"]

    def bucket_indices(self) -> List[Tuple[int, ...]]:
        """Every bucket, in manifest order (the last dim varies fastest);
        ``[()]`` for a kernel without buckets."""
        return list(itertools.product(*[range(len(b.edges) + 1) for b in self.buckets]))

    def bucket_of(self, values: Mapping[str, int]) -> Tuple[int, ...]:
        """The bucket of the parameter values, by the format's inclusive edges."""
        return tuple(sum(1 for edge in b.edges if values[b.param] > edge) for b in self.buckets)

    def config(self, name: str) -> Config:
        for config in self.configs:
            if config.name == name:
                return config
        raise SpecError(f"kernel '{self.name}': no config named '{name}' "
                        f"(configs: {[c.name for c in self.configs]})")

    def default_config(self, bucket_number: int) -> Config:
        """The declared default config of the ``bucket_number``-th bucket."""
        if isinstance(self.default, str):
            return self.config(self.default)
        return self.config(self.default[bucket_number])

    def all_specializations(self) -> List[Specialization]:
        """The generic variant first, then the declared ones."""
        return [Specialization(GENERIC)] + list(self.specializations)

    def constexprs(self, config: Config) -> Mapping[str, Any]:
        """The values of every constexpr parameter under ``config``."""
        return {**self.constants, **config.constexprs}

    @property
    def manifest_grid(self) -> Optional[List[str]]:
        """The grid written to the manifest: the spec's, unless it is absent or names a
        launch value (the runtime knows only call parameters and constexprs)."""
        if not self.grid:
            return None
        names = {n for expr in self.grid for n in grid_names(parse_grid_expression(expr))}
        return None if names & set(self.launch_values) else list(self.grid)

    def allowed(self, shape: Mapping[str, int], config: Config) -> bool:
        """Whether ``config`` is a candidate for the bucket of ``shape``."""
        return self.config_allowed is None or bool(self.config_allowed(dict(shape), config))

    def grid_for(self, args: Mapping[str, Any], config: Config) -> Tuple[int, ...]:
        """Evaluate the grid expressions for integer ``args`` (call parameters and
        launch values) under ``config``."""
        values = {name: value for name, value in args.items()
                  if isinstance(value, int) and not isinstance(value, bool)}
        values.update({k: v for k, v in self.constexprs(config).items()
                       if isinstance(v, int) and not isinstance(v, bool)})
        return tuple(evaluate_grid_expression(parse_grid_expression(expr), values)
                     for expr in self.grid)


def _fail(where: str, message: str):
    raise SpecError(f"{where}: {message}")


def check_spec(spec: KernelSpec, origin: str = "spec") -> None:
    """Validate one kernel spec; raise SpecError naming what is wrong."""
    if not isinstance(spec, KernelSpec):
        _fail(origin, f"KPACK_KERNELS holds {type(spec).__name__}, expected KernelSpec")
    where = f"{origin}: kernel '{spec.name}'"
    arg_names = getattr(spec.fn, "arg_names", None)
    if arg_names is None:
        _fail(where, f"fn {spec.fn!r} is not a @triton.jit function")
    names = [name for name, _ in spec.params]
    if names != list(arg_names):
        _fail(where, f"params {names} do not match {spec.fn.__name__}'s parameters "
                     f"{list(arg_names)} (same names, same order, constexprs included)")
    types = dict(spec.params)
    for name, param_type in spec.params:
        if not isinstance(param_type, str):
            _fail(where, f"parameter '{name}': type {param_type!r} is not a Triton type "
                         f"string; tuple parameters are not supported by build specs (record "
                         f"mode exports them, flattened: docs/record.md)")
        try:
            if not is_tensordesc(param_type):
                slot_size(param_type)
            elif _SPEC_TENSORDESC.fullmatch(param_type) is None:
                raise ValueError(f"'{param_type}' is not a tensordesc<DTYPE[B0, ...]> type "
                                 f"(block dimensions: integers or constexpr names)")
        except ValueError as err:
            _fail(where, f"parameter '{name}': {err}")

    # Configs: unique names, and with the constants exactly the constexpr params.
    if not spec.configs:
        _fail(where, "needs at least one config")
    config_names = [c.name for c in spec.configs]
    for name in config_names:
        if config_names.count(name) > 1:
            _fail(where, f"duplicate config name '{name}'")
    for name in spec.constants:
        if types.get(name) != "constexpr":
            _fail(where, f"constants: '{name}' is not a constexpr parameter")
    for config in spec.configs:
        cwhere = f"{where}: config '{config.name}'"
        for name in config.constexprs:
            if name not in types:
                _fail(cwhere, f"unknown parameter '{name}'")
            if types[name] != "constexpr":
                _fail(cwhere, f"'{name}' is a call parameter ({types[name]}), not a constexpr")
            if name in spec.constants:
                _fail(cwhere, f"'{name}' is also in the kernel's constants")
        missing = [n for n in spec.constexpr_params
                   if n not in config.constexprs and n not in spec.constants]
        if missing:
            _fail(cwhere, f"missing constexpr(s) {missing} (give them in the config or in "
                          f"the kernel's constants)")
        for option, value, limit in (("num_warps", config.num_warps, 32),
                                     ("num_ctas", config.num_ctas, 16)):
            if not isinstance(value, int) or not 1 <= value <= limit \
                    or value & (value - 1):
                _fail(cwhere, f"{option} = {value!r} must be a power of two in 1..{limit}")
        if not isinstance(config.num_stages, int) or config.num_stages < 1:
            _fail(cwhere, f"num_stages = {config.num_stages!r} must be a positive integer")
        for name, param_type in spec.params if not missing else ():
            try:
                slot_size(resolve_type(param_type, spec.constexprs(config)))
            except ValueError as err:
                _fail(cwhere, f"parameter '{name}': {err}")

    # Buckets and one representative shape per bucket, inside it.
    for i, bucket in enumerate(spec.buckets):
        if bucket.param not in types:
            _fail(where, f"buckets[{i}]: unknown parameter '{bucket.param}'")
        if types[bucket.param] not in INTEGER_TYPES:
            _fail(where, f"buckets[{i}]: parameter '{bucket.param}' is {types[bucket.param]}; "
                         f"a bucket parameter must be an integer call parameter")
        edges = list(bucket.edges)
        if not edges or any(not isinstance(e, int) or isinstance(e, bool) for e in edges) \
                or any(a >= b for a, b in zip(edges, edges[1:])):
            _fail(where, f"buckets[{i}] ('{bucket.param}'): edges {edges!r} must be a "
                         f"non-empty, strictly increasing list of integers")
    buckets = spec.bucket_indices()
    if len(spec.representatives) != len(buckets):
        _fail(where, f"{len(spec.representatives)} representative shapes for {len(buckets)} "
                     f"bucket(s); give exactly one per bucket, in bucket order")
    for number, (index, shape) in enumerate(zip(buckets, spec.representatives)):
        for bucket in spec.buckets:
            value = shape.get(bucket.param)
            if not isinstance(value, int) or isinstance(value, bool):
                _fail(where, f"representatives[{number}]: bucket parameter '{bucket.param}' "
                             f"needs an integer value, got {value!r}")
        got = spec.bucket_of(shape)
        if got != index:
            _fail(where, f"representatives[{number}] {dict(shape)} is in bucket {list(got)}, "
                         f"not in bucket {list(index)} ({describe_bucket(spec, index)})")

    # The default config(s).
    if isinstance(spec.default, str):
        spec.config(spec.default)
    elif isinstance(spec.default, Sequence) and len(spec.default) == len(buckets):
        for name in spec.default:
            spec.config(name)
    else:
        _fail(where, f"default must be a config name or one config name per bucket "
                     f"({len(buckets)}), got {spec.default!r}")

    # Specializations.
    spec_names = [GENERIC] + [s.name for s in spec.specializations]
    for name in spec_names:
        if spec_names.count(name) > 1:
            _fail(where, f"specialization name '{name}' used twice ('{GENERIC}' is implicit)")
    for special in spec.specializations:
        swhere = f"{where}: specialization '{special.name}'"
        if not special.div16 and not special.eq1:
            _fail(swhere, "assumes nothing; it would duplicate the generic variant")
        for kind, params in (("div16", special.div16), ("eq1", special.eq1)):
            for name in params:
                if name not in types or types[name] == "constexpr":
                    _fail(swhere, f"{kind}: '{name}' is not a call parameter")
                param_type = types[name]
                if kind == "eq1" and param_type not in INTEGER_TYPES:
                    _fail(swhere, f"eq1 on '{name}' of type {param_type}: needs an integer")
                if kind == "div16" and param_type not in INTEGER_TYPES \
                        and not param_type.startswith("*"):
                    _fail(swhere, f"div16 on '{name}' of type {param_type}: needs a pointer "
                                  f"or an integer")
        both = set(special.div16) & set(special.eq1)
        if both:
            _fail(swhere, f"{sorted(both)} cannot be both div16 and eq1")

    # Grid expressions, for every config: over integer call parameters, the config's
    # integer constexprs and the launch values.
    for name in spec.launch_values:
        if name in types:
            _fail(where, f"launch_values: '{name}' is a parameter of the kernel; launch "
                         f"values are what the grid needs besides the parameters")
        if list(spec.launch_values).count(name) > 1:
            _fail(where, f"launch_values: '{name}' listed twice")
    if isinstance(spec.grid, str) or len(spec.grid) > 3:
        _fail(where, f"grid must be a list of 1-3 expression strings (or empty: callers "
                     f"pass the grid), got {spec.grid!r}")
    grid_types = {**types, **{name: "i64" for name in spec.launch_values}}
    for config in spec.configs:
        for axis, expr in enumerate(spec.grid):
            try:
                check_grid_expression(expr, grid_types, spec.constexprs(config),
                                      f"{where}: config '{config.name}': grid[{axis}]")
            except ValueError as err:
                raise SpecError(str(err)) from None
    for name in spec.outputs:
        if not types.get(name, "").startswith("*") and not is_tensordesc(types.get(name)):
            _fail(where, f"outputs: '{name}' is not a pointer or tensordesc parameter")
    for name in spec.readonly:
        if not types.get(name, "").startswith("*"):
            _fail(where, f"readonly: '{name}' is not a pointer parameter")
    both = set(spec.outputs) & set(spec.readonly)
    if both:
        _fail(where, f"{sorted(both)} are both outputs and readonly")
    def _pair(value):
        return isinstance(value, (tuple, list)) and len(value) == 2 and all(
            isinstance(t, (int, float)) and not isinstance(t, bool) and t >= 0 for t in value)

    if isinstance(spec.tolerance, Mapping):
        for name, value in spec.tolerance.items():
            if name not in spec.outputs:
                _fail(where, f"tolerance: '{name}' is not one of the outputs {list(spec.outputs)}")
            if not _pair(value):
                _fail(where, f"tolerance['{name}'] must be (rtol, atol), two non-negative "
                             f"numbers, got {value!r}")
    elif spec.tolerance is not None and not _pair(spec.tolerance):
        _fail(where, f"tolerance must be (rtol, atol), two non-negative numbers, or "
                     f"{{output: (rtol, atol)}}, got {spec.tolerance!r}")
    if not isinstance(spec.grid_tolerant, bool):
        _fail(where, f"grid_tolerant must be True or False, got {spec.grid_tolerant!r}")
    if spec.grid_tolerant and not spec.grid:
        _fail(where, "grid_tolerant needs a grid: a larger grid is defined (and proven) "
                     "against the spec's grid expressions")
    if spec.grid_max and not spec.grid_tolerant:
        _fail(where, "grid_max is set but grid_tolerant is not")
    last_edges = {b.param: list(b.edges)[-1] for b in spec.buckets if list(b.edges)}
    for name, value in dict(spec.grid_max).items():
        if name not in last_edges:
            _fail(where, f"grid_max: '{name}' is not a bucket parameter")
        if not isinstance(value, int) or isinstance(value, bool) or value <= last_edges[name]:
            _fail(where, f"grid_max['{name}'] = {value!r} must be an integer above the last "
                         f"edge {last_edges[name]}")
    if isinstance(spec.grid_cost_limit, bool) \
            or not isinstance(spec.grid_cost_limit, (int, float)) or spec.grid_cost_limit < 1:
        _fail(where, f"grid_cost_limit must be a number >= 1 (padded over exact GPU time), got "
                     f"{spec.grid_cost_limit!r}")
    if not callable(spec.make_inputs):
        _fail(where, "make_inputs must be callable")
    if spec.config_allowed is not None:
        if not callable(spec.config_allowed):
            _fail(where, "config_allowed must be callable (shape, config) -> bool")
        for number, shape in enumerate(spec.representatives):
            default = spec.default_config(number)
            if not spec.allowed(shape, default):
                _fail(where, f"default config '{default.name}' of bucket "
                             f"{list(buckets[number])} ({describe_bucket(spec, buckets[number])})"
                             f" is excluded by config_allowed for {dict(shape)}")


def source_qualname(fn) -> str:
    """``module.qualname`` of a ``@triton.jit`` function, with a spec file's stem for the
    unique module name ``load_specs`` imported it under."""
    module = fn.fn.__module__
    return f"{SPEC_MODULE_STEMS.get(module, module)}.{fn.fn.__qualname__}"


def describe_bucket(spec: KernelSpec, index: Sequence[int]) -> str:
    """``17 <= M <= 64`` style text for a bucket."""
    return describe_bucket_index([(b.param, list(b.edges)) for b in spec.buckets], index)


def load_specs(path) -> List[KernelSpec]:
    """Import a spec file and return its checked ``KPACK_KERNELS``."""
    path = Path(path)
    if not path.is_file():
        raise SpecError(f"{path}: no such spec file")
    module_name = f"{SPEC_MODULE_PREFIX}{path.stem}_{abs(hash(str(path.resolve())))}"
    SPEC_MODULE_STEMS[module_name] = path.stem
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[module_name] = module  # dataclasses and triton.jit look modules up by name
    try:
        loader_spec.loader.exec_module(module)
    except SpecError:
        raise
    except Exception as err:
        del sys.modules[module_name]
        raise SpecError(f"{path}: importing the spec failed: {type(err).__name__}: {err}") \
            from err
    kernels = getattr(module, "KPACK_KERNELS", None)
    if not isinstance(kernels, (list, tuple)) or not kernels:
        raise SpecError(f"{path}: defines no KPACK_KERNELS (a non-empty list of KernelSpec)")
    for spec in kernels:
        check_spec(spec, str(path))
    return list(kernels)
