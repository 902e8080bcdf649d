"""Build a kpack pack from build specs, autotuning each bucket on the GPU.

::

    python -m kpack_tools.build SPEC.py [SPEC.py ...] --out PACK
        [--target 90] [--no-tune] [--tune-reps N] [--reuse-tuning TUNING.json
        [--retune-buckets [KERNEL:]B,...]] [--jobs N]

Each spec file defines ``KPACK_KERNELS`` (``docs/build-spec.md``).  For every
kernel and bucket the builder picks a config -- when torch sees a CUDA GPU, the
fastest of the candidates whose outputs pass the check against the spec's
reference (``kpack_tools.autotune``); else (or with ``--no-tune``) the spec's
declared default, recorded as untuned; or, with ``--reuse-tuning``, what an
earlier ``tuning.json`` chose (except in the ``--retune-buckets`` buckets, of every
kernel or, written ``KERNEL:B``, of one) --
then compiles one variant per (bucket, specialization) with ``triton.compile``
for ``sm_<target>`` and writes the pack: manifest (layouts read back from the
cubins, each kernel's ``source``), cubins with sha256, and ``tuning.json``
(every candidate's check and time per bucket, or why no tuning happened).
Compiling needs no GPU.  Only Triton 3.6.0 is supported: its JIT's
specialization and ABI are what the variants reproduce
(``docs/pack-format.md``, ``include/kpack/arg.h``).

A spec's ``grid_tolerant`` flag is proven on the GPU (``kpack_tools.grid_proof``)
before the manifest says ``grid_tolerance``; without a GPU it is written as
asserted and the build says it is unproven. A verdict records the sha256 of the
kernel's compiled code (``code_sha256``), and one reused from ``--reuse-tuning``
without a GPU is kept only for the same code.
"""

import argparse
import hashlib
import json
import re
import sys
from typing import Any, Callable, Collection, Dict, List, Mapping, Optional, Sequence, Tuple

from kpack_tools import SUPPORTED_TRITON_VERSIONS, grid_proof
from kpack_tools.pack import Kernel, Variant, pack_bytes, source_identity, write_pack
from kpack_tools.spec import GENERIC, Config, KernelSpec, SpecError, Specialization, \
    describe_bucket, load_specs, source_qualname

TUNING_FILE = "tuning.json"
TUNING_FORMAT = "kpack-tuning/2"


class BuildError(RuntimeError):
    """The build cannot proceed (wrong Triton, compile result not as specified)."""


def check_triton_version(version: str) -> None:
    """Refuse any Triton but the supported ones, naming both."""
    if version not in SUPPORTED_TRITON_VERSIONS:
        raise BuildError(f"Triton {version} is installed, but kpack_tools.build supports only "
                         f"Triton {', '.join(SUPPORTED_TRITON_VERSIONS)} (its specialization "
                         f"rules and kernel ABI are what the pack reproduces); install "
                         f"triton=={SUPPORTED_TRITON_VERSIONS[-1]}")


def bucket_label(index: Sequence[int]) -> str:
    """A bucket index as variant names and ``--retune-buckets`` write it: ``1``, ``0_2``."""
    return "_".join(str(i) for i in index)


def variant_name(spec: KernelSpec, index: Sequence[int], special: Specialization) -> str:
    """``b<i>[_<j>...]_<specialization>``, or the specialization alone without buckets."""
    if not spec.buckets:
        return special.name
    return "b" + bucket_label(index) + "_" + special.name


_TT_FUNC = re.compile(r"tt\.func public @\w+\((.*)\) attributes")


def compile_variant(spec: KernelSpec, config: Config, special: Specialization,
                    target: int = 90):
    """Compile one variant with ``triton.compile`` for ``sm_<target>``.

    As Triton 3.6's JIT would for arguments that satisfy the specialization:
    ``div16`` parameters get ``tt.divisibility = 16``; ``eq1`` parameters
    become constexprs equal to 1, so they vanish from the cubin.  Line info is
    off, so the cubin is the same from any checkout.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from kpack_tools.fixed_pack import line_info_disabled

    signature = dict(spec.params_for(config))
    constexprs = dict(spec.constexprs(config))
    for name in special.eq1:
        signature[name] = "constexpr"
        constexprs[name] = 1
    arg_names = list(spec.fn.arg_names)
    attrs = {(arg_names.index(name),): [["tt.divisibility", 16]] for name in special.div16}
    src = ASTSource(fn=spec.fn, signature=signature, constexprs=constexprs, attrs=attrs)
    options = {**spec.options, "num_warps": config.num_warps,
               "num_stages": config.num_stages, "num_ctas": config.num_ctas}
    with line_info_disabled():
        compiled = triton.compile(src, target=GPUTarget("cuda", target, 32), options=options)
    match = _TT_FUNC.search(compiled.asm["ttir"])
    if match is None:
        raise BuildError(f"kernel '{spec.name}': no public tt.func in the TTIR")
    div_count = match.group(1).count("tt.divisibility = 16")
    if div_count != len(special.div16):
        raise BuildError(f"kernel '{spec.name}': specialization '{special.name}': TTIR has "
                         f"{div_count} tt.divisibility = 16 arguments, expected "
                         f"{len(special.div16)} ({list(special.div16)})")
    return compiled


_WORKER_SPECS: Dict[tuple, Dict[str, KernelSpec]] = {}


def _compile_in_worker(spec_paths, name, config_name, special_name, target) -> float:
    """In a pool process: compile one variant (filling Triton's on-disk cache); return the
    seconds it took."""
    import time
    paths = tuple(str(p) for p in spec_paths)
    if paths not in _WORKER_SPECS:
        _WORKER_SPECS[paths] = {s.name: s for path in paths for s in load_specs(path)}
    spec = _WORKER_SPECS[paths][name]
    special = next(s for s in spec.all_specializations() if s.name == special_name)
    start = time.perf_counter()
    compile_variant(spec, spec.config(config_name), special, target)
    return time.perf_counter() - start


def precompile(spec_paths: Sequence, keys: Sequence[tuple], target: int, jobs: int,
               log: Callable[[str], None]) -> None:
    """Compile the variants ``keys`` ((kernel, config, specialization) names) in ``jobs``
    processes. Each fills Triton's on-disk cache (the key covers source, options and the
    line-info setting), so the serial pass that then builds the pack finds every variant
    there: the same cubins, ``jobs`` times sooner. Processes are spawned (each imports
    the spec files anew), never forked from a parent that may hold a CUDA context."""
    import concurrent.futures
    import multiprocessing
    import time
    start = time.perf_counter()
    workers = min(jobs, len(keys))
    with concurrent.futures.ProcessPoolExecutor(
            max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(_compile_in_worker, [str(p) for p in spec_paths], *key,
                               target): key for key in keys}
        seconds = []
        for future in concurrent.futures.as_completed(futures):
            try:
                seconds.append(future.result())
            except Exception as err:  # noqa: BLE001 - the serial pass reports it properly
                log(f"precompile of {futures[future]} failed ({type(err).__name__}: {err}); "
                    f"compiling it in the build process")
    log(f"compiled {len(keys)} variants in {time.perf_counter() - start:.1f} s with "
        f"{workers} processes ({sum(seconds):.1f} s of compiling, "
        f"{sum(seconds) / max(1, len(seconds)):.1f} s per variant)")


def _warm_in_worker(spec_paths, name, bucket, config_names) -> float:
    """In a pool process with a CUDA device: JIT-compile (``warmup``, no launch) ``config_names``
    of kernel ``name`` on bucket ``bucket``'s representative inputs, filling Triton's on-disk
    cache for the tuner; return the seconds it took."""
    import time
    from kpack_tools import autotune
    paths = tuple(str(p) for p in spec_paths)
    if paths not in _WORKER_SPECS:
        _WORKER_SPECS[paths] = {s.name: s for path in paths for s in load_specs(path)}
    spec = _WORKER_SPECS[paths][name]
    args = dict(spec.make_inputs(dict(spec.representatives[bucket]), "cuda"))
    start = time.perf_counter()
    for config_name in config_names:
        try:
            autotune.jit_launcher(spec, spec.config(config_name), args, warm=True)()
        except Exception:  # noqa: BLE001 - the tuner runs the config itself and records why
            pass
    return time.perf_counter() - start


def jit_tasks(specs: Sequence[KernelSpec], reused: Mapping[str, List[Dict[str, Any]]],
              retune: Mapping[str, Collection[Tuple[int, ...]]]
              ) -> List[Tuple[str, int, List[str]]]:
    """(kernel, bucket number, config names) that a tuning build JIT-compiles: every
    candidate of the buckets it tunes (all buckets of a kernel not in ``reused``, a
    reused kernel's ``retune`` buckets) and, for the grid proof, the reused config of
    each other bucket of a grid-tolerant reused kernel. ``reused``: per kernel name, its
    bucket results from ``--reuse-tuning``; ``retune``: per kernel name, the buckets
    retuned (``retune_sets``)."""
    tasks = []
    for spec in specs:
        for number, (index, shape) in enumerate(zip(spec.bucket_indices(),
                                                    spec.representatives)):
            if spec.name not in reused or index in retune.get(spec.name, ()):
                names = [c.name for c in spec.configs if spec.allowed(shape, c)]
            else:
                names = [reused[spec.name][number]["chosen"]] if spec.grid_tolerant else []
            if names:
                tasks.append((spec.name, number, names))
    return tasks


def prewarm_tuning(spec_paths: Sequence, tasks: Sequence[Tuple[str, int, List[str]]],
                   jobs: int, log: Callable[[str], None]) -> None:
    """JIT-compile ``tasks`` (``jit_tasks``: every candidate the tuner will run and every
    config the grid proof will run), in ``jobs`` spawned processes (one task per kernel
    and bucket), so that the tuner's own compiles, serial in its process, find them in
    Triton's on-disk cache: the same compiled kernels (the cache key covers source,
    specialization, constexprs and options), tuned ``jobs`` times sooner. A failure here
    only costs the time saved: the tuner compiles and checks every candidate itself."""
    import concurrent.futures
    import multiprocessing
    import time
    if not tasks:
        return
    start = time.perf_counter()
    workers = min(jobs, len(tasks))
    compiles = sum(len(t[2]) for t in tasks)
    with concurrent.futures.ProcessPoolExecutor(
            max_workers=workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {pool.submit(_warm_in_worker, [str(p) for p in spec_paths], *task): task
                   for task in tasks}
        for future in concurrent.futures.as_completed(futures):
            try:
                future.result()
            except Exception as err:  # noqa: BLE001 - the tuner reports it properly
                log(f"prewarm of {futures[future][:2]} failed ({type(err).__name__}: {err})")
    log(f"JIT-compiled {compiles} tuning candidates and proof configs in "
        f"{time.perf_counter() - start:.1f} s with {workers} processes")


def _untuned_results(spec: KernelSpec) -> List[Dict[str, Any]]:
    return [{"bucket": list(index), "range": describe_bucket(spec, index),
             "representative": dict(shape), "chosen": spec.default_config(i).name,
             "times_us": None, "checked_against": None, "errors": {}, "mismatches": {},
             "excluded": {}}
            for i, (index, shape) in enumerate(zip(spec.bucket_indices(), spec.representatives))]


def _tuned_results(spec: KernelSpec, backend, reps: int, log,
                   only: Optional[Collection[Tuple[int, ...]]] = None) -> List[Dict[str, Any]]:
    from kpack_tools import autotune
    try:
        results = autotune.tune_kernel(spec, backend, reps=reps, log=log, only=only)
    except autotune.TuningError as err:
        raise BuildError(str(err)) from None
    return [{"bucket": list(r.index), "range": describe_bucket(spec, r.index),
             "representative": r.representative, "chosen": r.chosen, "times_us": r.times_us,
             "checked_against": r.checked_against, "errors": r.errors,
             "mismatches": r.mismatches, "excluded": r.excluded} for r in results]


def _grid_tolerance(spec: KernelSpec, results, device, backend, reps, why_not, reused,
                    log) -> Optional[Dict[str, Any]]:
    """The tuning.json ``grid_tolerance`` entry of a kernel whose spec asserts it: proven
    (or refused) on the GPU when there is one, reused from ``--reuse-tuning`` when that
    file proved it with the same configs, else unproven."""
    if not spec.grid_tolerant:
        return None
    configs = [spec.config(r["chosen"]) for r in results]
    if device is not None:
        return grid_proof.prove(spec, configs, backend, reps=reps, log=log)
    previous = (reused or {}).get("grid_tolerance")
    if previous and previous.get("verdict") in (grid_proof.PROVEN, grid_proof.REFUSED,
                                                grid_proof.TOO_COSTLY) \
            and previous.get("configs") == [c.name for c in configs]:
        changed = grid_proof.changed_since(spec, previous)
        if changed is None:
            log(f"kernel '{spec.name}': grid tolerance {previous['verdict']} as in the reused "
                f"tuning.json")
            return dict(previous)
        why_not = (f"{changed} since the reused tuning.json's verdict "
                   f"({previous['verdict']}); prove it again on a GPU")
    entry = grid_proof.unproven(spec, why_not if why_not else "no GPU")
    log(f"kernel '{spec.name}': grid tolerance asserted by the spec, UNPROVEN ({why_not}); "
        f"written as \"asserted\"")
    return entry


def _code_sha256(cubins: Sequence[bytes]) -> str:
    """The identity of a kernel's compiled code: sha256 over its variants' cubins' sha256s,
    sorted (the same code whatever the variants' order)."""
    digests = sorted(hashlib.sha256(c).hexdigest() for c in cubins)
    return hashlib.sha256("\n".join(digests).encode()).hexdigest()


def _tie_to_code(spec: KernelSpec, tolerance: Dict[str, Any], code: str, proven_here: bool,
                 log) -> None:
    """Ties a grid-tolerance verdict to the kernel's compiled code, in place: one reached
    on this build's GPU records `code`; a reused one is kept for the same code, written
    unproven for other code (the kernel or a helper changed since it was reached) and kept,
    with a note, when it records none (a tuning.json older than the field)."""
    if proven_here:
        tolerance["code_sha256"] = code
        return
    if tolerance["verdict"] == grid_proof.UNPROVEN:
        return
    had = tolerance.get("code_sha256")
    if had is None:
        log(f"kernel '{spec.name}': the reused grid-tolerance verdict records no code hash "
            f"(an older tuning.json): kept as it is")
    elif had != code:
        verdict = tolerance["verdict"]
        tolerance.clear()
        tolerance.update(grid_proof.unproven(
            spec, f"the kernel's code changed since the reused tuning.json's verdict "
                  f"({verdict}); prove it again on a GPU"))
        log(f"kernel '{spec.name}': grid tolerance {verdict} in the reused tuning.json, but "
            f"for other code: asserted by the spec, UNPROVEN; written as \"asserted\"")


def _config_json(config: Config) -> Mapping[str, Any]:
    return {"name": config.name, "constexprs": dict(config.constexprs),
            "num_warps": config.num_warps, "num_stages": config.num_stages,
            "num_ctas": config.num_ctas}


def _reused_results(spec: KernelSpec, old: Mapping[str, Any], path,
                    retune: Collection[Tuple[int, ...]] = (),
                    unlisted: bool = False) -> List[Dict[str, Any]]:
    """The buckets of a previous tuning.json entry for ``spec``, if they still describe
    it: same buckets, and every chosen config still in the spec with the same values and,
    outside the ``retune`` buckets and unless ``unlisted``, still a candidate of its bucket
    (``config_allowed`` at the bucket's representative shape: a bucket pinned to another
    config since is not silently built with the old choice)."""
    where = f"--reuse-tuning {path}: kernel '{spec.name}'"
    buckets = old.get("buckets", [])
    ranges = [describe_bucket(spec, index) for index in spec.bucket_indices()]
    if [b.get("range") for b in buckets] != ranges:
        raise BuildError(f"{where}: its buckets {[b.get('range') for b in buckets]} are not the "
                         f"spec's {ranges}")
    configs = {c["name"]: c for c in old.get("configs", [])}
    results = []
    for bucket, index, shape in zip(buckets, spec.bucket_indices(), spec.representatives):
        config = spec.config(bucket["chosen"])
        if configs.get(config.name) != _config_json(config):
            raise BuildError(f"{where}: config '{config.name}' is {configs.get(config.name)} "
                             f"there and {_config_json(config)} in the spec")
        if not unlisted and tuple(index) not in retune and not spec.allowed(shape, config):
            raise BuildError(f"{where}: bucket {list(index)} ({bucket.get('range')}) chose "
                             f"'{config.name}' there, which the spec no longer offers for "
                             f"that bucket; tune it again (--retune-buckets "
                             f"{bucket_label(index)})")
        results.append({key: bucket.get(key) for key in (
            "bucket", "range", "representative", "chosen", "times_us", "checked_against")})
        results[-1].update({key: bucket.get(key, {}) for key in ("errors", "mismatches",
                                                                 "excluded")})
    return results


def build(spec_paths: Sequence, out_dir, target: int = 90, tune: bool = True,
          reps: int = 25, log: Optional[Callable[[str], None]] = print, backend=None,
          reuse_tuning=None, jobs: int = 1, retune_buckets: Sequence = (),
          reuse_unlisted: bool = False):
    """Build a pack from spec files; return ``(manifest, tuning)``.

    ``tune`` asks for tuning; it happens only with a backend (default: torch
    and a CUDA GPU), otherwise the defaults are used and ``tuning.json`` says
    why.  ``reuse_tuning`` (a tuning.json path) takes each kernel it lists
    from there instead; ``retune_buckets`` excepts buckets, which are tuned (or
    given the spec's defaults) as if unlisted: an item ``(i, ...)`` (a bucket
    index) that bucket of every kernel the file lists, an item ``(name, (i, ...))``
    that bucket of kernel ``name`` only (``retune_sets``); ``reuse_unlisted``
    takes reused choices that their bucket's candidates no longer include
    (experiments that build a bucket with a config outside its list, e.g.
    ``bench/llama_variant_sweep.py``), which are refused otherwise.  Raises
    ``BuildError`` for a bucket where no candidate passes the check.  ``jobs`` > 1
    compiles the variants in that many processes first (``precompile``).
    """
    import triton
    log = log or (lambda line: None)
    check_triton_version(triton.__version__)
    specs: List[KernelSpec] = []
    for path in spec_paths:
        specs.extend(load_specs(path))
    names = [spec.name for spec in specs]
    for name in names:
        if names.count(name) > 1:
            raise SpecError(f"kernel name '{name}' is defined by more than one spec")
    reused = {}
    if reuse_tuning is not None:
        try:
            previous = json.loads(open(reuse_tuning, encoding="utf-8").read())
        except (OSError, ValueError) as err:
            raise BuildError(f"--reuse-tuning {reuse_tuning}: {err}") from None
        if previous.get("target", target) != target:
            raise BuildError(f"--reuse-tuning {reuse_tuning}: its configs were chosen for "
                             f"sm_{previous['target']}; this build targets sm_{target} "
                             f"(tune for it, or build for sm_{previous['target']})")
        reused = {k["name"]: (k, k.get("tuned", previous.get("tuned")),
                              k.get("device", previous.get("device")))
                  for k in previous.get("kernels", [])}
    if retune_buckets and reuse_tuning is None:
        raise BuildError("retuning buckets (--retune-buckets) needs --reuse-tuning: the "
                         "tuning.json the other buckets' configs come from")
    retune = retune_sets(specs, reused, retune_buckets, reuse_tuning)
    reused_results = {}
    for spec in specs:
        if spec.name in reused:
            reused_results[spec.name] = _reused_results(spec, reused[spec.name][0],
                                                        reuse_tuning, retune[spec.name],
                                                        reuse_unlisted)

    why_not = "--no-tune was given"
    if tune and backend is None:
        from kpack_tools import autotune
        backend, why_not = autotune.cuda_backend()
    device = backend.device if tune and backend is not None else None
    tuning = {"format": TUNING_FORMAT, "tuned": device is not None, "device": device,
              "reason": None if device else
              f"not tuned: {why_not}; {_configs_from(specs, reused, reuse_tuning, retune)}",
              "reps": reps if device else None, "target": target,
              "triton_version": triton.__version__, "kernels": []}
    if device is None:
        log(f"not tuning ({why_not}): {_configs_from(specs, reused, reuse_tuning, retune)}")

    from kpack_tools import autotune
    if device is not None and jobs > 1 and isinstance(backend, autotune.CudaBackend):
        prewarm_tuning(spec_paths, jit_tasks(specs, reused_results, retune), jobs, log)
    chosen = []  # per spec: (bucket results, grid tolerance entry)
    for spec in specs:
        entry = {"name": spec.name, "configs": [_config_json(c) for c in spec.configs]}
        if spec.name in reused and retune[spec.name]:
            old, was_tuned, _ = reused[spec.name]
            mine = retune[spec.name]
            fresh = (_tuned_results(spec, backend, reps, log, only=mine) if device is not None
                     else _untuned_results(spec))
            fresh = {tuple(r["bucket"]): r for r in fresh}
            results = [fresh[tuple(r["bucket"])] if tuple(r["bucket"]) in mine else r
                       for r in reused_results[spec.name]]
            tuned = bool(was_tuned) and device is not None
            entry.update(tuned=tuned, device=device if tuned else None,
                         reused_from=str(reuse_tuning),
                         retuned_buckets=[list(i) for i in sorted(mine)])
            log(f"kernel '{spec.name}': buckets {[list(i) for i in sorted(mine)]} "
                f"{'tuned' if device is not None else 'at the spec defaults'}, the others' "
                f"configs from {reuse_tuning}")
        elif spec.name in reused:
            old, was_tuned, was_device = reused[spec.name]
            results = reused_results[spec.name]
            entry.update(tuned=bool(was_tuned), device=was_device,
                         reused_from=str(reuse_tuning))
            log(f"kernel '{spec.name}': configs from {reuse_tuning} "
                f"({'tuned on ' + str(was_device) if was_tuned else 'not tuned'})")
        elif device is not None:
            results = _tuned_results(spec, backend, reps, log)
            entry.update(tuned=True, device=device)
        else:
            results = _untuned_results(spec)
            entry.update(tuned=False, device=None)
        entry["buckets"] = results
        tolerance = _grid_tolerance(spec, results, device, backend, reps, why_not,
                                    old if spec.name in reused else None, log)
        if tolerance is not None:
            entry["grid_tolerance"] = tolerance
        tuning["kernels"].append(entry)
        chosen.append((results, tolerance))

    keys = list(dict.fromkeys((spec.name, spec.config(result["chosen"]).name, special.name)
                              for spec, (results, _) in zip(specs, chosen)
                              for result in results for special in spec.all_specializations()))
    if jobs > 1 and len(keys) > 1:
        precompile(spec_paths, keys, target, jobs, log)
    kernels = []
    compiled_cache = {}
    for spec, (results, tolerance) in zip(specs, chosen):
        params = None  # the first variant's types; later variants override what differs
        variants = []
        cubins = []
        for index, result in zip(spec.bucket_indices(), results):
            config = spec.config(result["chosen"])
            for special in spec.all_specializations():
                key = (spec.name, config.name, special.name)
                if key not in compiled_cache:
                    compiled_cache[key] = compile_variant(spec, config, special, target)
                cubins.append(compiled_cache[key].asm["cubin"])
                assumptions = {name: ["div16"] for name in special.div16}
                assumptions.update({name: ["eq1"] for name in special.eq1})
                constexprs = {name: value for name, value in spec.constexprs(config).items()}
                # A tensordesc's block shape follows the config: the kernel's type is the
                # first variant's, the others' differ through `types`.
                resolved = spec.params_for(config)
                params = params or resolved
                retyped = {name: t for (name, t), (_, first) in zip(resolved, params)
                           if t != first}
                variants.append(Variant.from_compiled(
                    variant_name(spec, index, special), compiled_cache[key], constexprs,
                    bucket=list(index) if spec.buckets else None,
                    assumptions=assumptions or None, types=retyped or None))
        if tolerance is not None:
            _tie_to_code(spec, tolerance, _code_sha256(cubins), device is not None, log)
        kernels.append(Kernel(
            name=spec.name, params=params, variants=variants,
            buckets=[{"param": b.param, "edges": list(b.edges)} for b in spec.buckets] or None,
            grid=spec.manifest_grid,
            source=source_identity(spec.fn, source_qualname(spec.fn)),
            readonly=list(spec.readonly),
            grid_tolerance=grid_proof.manifest_field(spec, tolerance)))
    generator = f"kpack_tools.build (triton {triton.__version__})"
    tuning_bytes = (json.dumps(tuning, indent=2, allow_nan=False) + "\n").encode()
    manifest = write_pack(out_dir, kernels, generator=generator,
                          extra_files={TUNING_FILE: tuning_bytes})
    _log_summary(manifest, tuning, out_dir, log)
    return manifest, tuning


def _configs_from(specs, reused, reuse_tuning, retune) -> str:
    """Where an untuned build's configs come from: ``--reuse-tuning``'s file for the
    kernels it lists (but their ``retune`` buckets, per kernel name), the spec's default
    configs for the others."""
    taken = [spec.name for spec in specs if spec.name in reused]
    default = [spec.name for spec in specs if spec.name not in reused]
    parts = []
    if taken:
        # One list when every listed kernel retunes the same buckets, else one per kernel.
        sets = {name: [list(i) for i in sorted(retune[name])] for name in taken
                if retune[name]}
        if not sets:
            but = ""
        elif len(sets) == len(taken) and len({str(v) for v in sets.values()}) == 1:
            but = f" but buckets {next(iter(sets.values()))}"
        else:
            but = " but buckets " + ", ".join(f"{v} of {name}" for name, v in sets.items())
        parts.append(f"configs of {', '.join(taken)} from {reuse_tuning}"
                     + (f"{but}: the spec's default configs" if but else ""))
    if default:
        parts.append(("each bucket uses the spec's default config" if not taken else
                      f"the spec's default configs for {', '.join(default)}"))
    return "; ".join(parts)


def _log_summary(manifest, tuning, out_dir, log) -> None:
    chosen = {(k["name"], tuple(b["bucket"])): b for k in tuning["kernels"] for b in k["buckets"]}
    log(f"{'kernel':16} {'variant':16} {'config':22} {'warps':>5} {'stages':>6} {'shared':>6} "
        f"assumptions")
    for kernel in manifest["kernels"]:
        for v in kernel["variants"]:
            result = chosen[(kernel["name"], tuple(v.get("bucket", [])))]
            assumed = " ".join(f"{kind}({','.join(p for p, k in v['assumptions'].items() if kind in k)})"
                               for kind in ("div16", "eq1")
                               if any(kind in k for k in v.get("assumptions", {}).values()))
            log(f"{kernel['name']:16} {v['name']:16} {result['chosen']:22} {v['num_warps']:5} "
                f"{v.get('num_stages', '-'):>6} {v['shared']:6} {assumed or '-'}")
    total = pack_bytes(out_dir)
    count = sum(len(k["variants"]) for k in manifest["kernels"])
    log(f"wrote {out_dir}: {len(manifest['kernels'])} kernels, {count} variants, {total} bytes, "
        f"{'tuned on ' + tuning['device'] if tuning['tuned'] else tuning['reason']}")


def retune_sets(specs: Sequence[KernelSpec], reused: Mapping[str, Any],
                retune_buckets: Sequence, reuse_tuning=None) -> Dict[str, set]:
    """Per kernel of ``specs``, the bucket indices ``retune_buckets`` excepts from the
    reused tuning: an item ``(i, ...)`` names a bucket of every kernel ``reused`` lists, an
    item ``(name, (i, ...))`` (``--retune-buckets name:i``) one of kernel ``name``, which
    must be among the specs and listed there. A bucket a kernel does not have is
    refused."""
    out = {spec.name: set() for spec in specs}
    everywhere = set()
    for item in retune_buckets:
        if item and isinstance(item[0], str):
            name, index = item[0], tuple(int(i) for i in item[1])
            if name not in out:
                raise BuildError(f"--retune-buckets {name}:{bucket_label(index)}: no kernel "
                                 f"'{name}' in the specs ({', '.join(out) or 'none'})")
            if name not in reused:
                raise BuildError(f"--retune-buckets {name}:{bucket_label(index)}: "
                                 f"--reuse-tuning {reuse_tuning} does not list kernel "
                                 f"'{name}' (its buckets are all tuned, or defaulted)")
            out[name].add(index)
        else:
            everywhere.add(tuple(int(i) for i in item))
    for spec in specs:
        if spec.name not in reused:
            continue
        out[spec.name] |= everywhere
        unknown = sorted(out[spec.name] - set(spec.bucket_indices()))
        if unknown:
            raise BuildError(f"--retune-buckets: kernel '{spec.name}' has no bucket "
                             f"{list(unknown[0])}; its buckets are "
                             f"{[list(i) for i in spec.bucket_indices()]}")
    return out


def _bucket_list(text: str) -> List[Tuple]:
    """``1,3`` or ``0_2,1_0``: bucket indices as variant names write them, each of
    every kernel; ``KERNEL:1``: that bucket of one kernel, as ``(KERNEL, (1,))``."""
    items = []
    for item in text.split(","):
        name, colon, index = item.rpartition(":")
        try:
            parsed = tuple(int(i) for i in index.split("_"))
        except ValueError:
            parsed = None
        if (parsed is None or any(i < 0 for i in parsed) or index.strip() != index
                or (colon and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name))):
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a comma-separated list of bucket indices (1 or 0_2, "
                f"or KERNEL:1 for one kernel's)")
        items.append((name, parsed) if colon else parsed)
    return items


def main(argv=None, prog: str = "python -m kpack_tools.build") -> int:
    """The command line; ``prog`` is how it was started (``kpack-build`` from the console
    script)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Compile (and autotune) the kernels of build specs into a kpack pack "
                    "(docs/build-spec.md).")
    parser.add_argument("specs", nargs="+", metavar="SPEC", help="spec file(s) (Python)")
    parser.add_argument("--out", required=True, help="pack directory to (re)write")
    parser.add_argument("--target", type=int, default=90,
                        help="CUDA compute capability, major*10+minor (default 90: sm_90a)")
    parser.add_argument("--no-tune", action="store_true",
                        help="do not autotune: use each spec's default configs")
    parser.add_argument("--tune-reps", type=int, default=25, metavar="N",
                        help="timed launches per config and bucket (median; default 25)")
    parser.add_argument("--jobs", type=int, default=1, metavar="N",
                        help="compile the pack's variants, and the tuning candidates, in N "
                             "processes (default 1)")
    parser.add_argument("--reuse-tuning", metavar="TUNING_JSON",
                        help="take the configs of every kernel this tuning.json lists from it "
                             "(e.g. the pack's own, to add a kernel without retuning the rest)")
    parser.add_argument("--retune-buckets", metavar="[KERNEL:]B[,...]", type=_bucket_list,
                        default=[],
                        help="with --reuse-tuning: tune these buckets (indices as in variant "
                             "names: 1, or 0_2 with two bucket parameters) of the kernels it "
                             "lists, or of one kernel written KERNEL:1, or give them the "
                             "spec's defaults without a GPU, and take only their other "
                             "buckets from it")
    parser.add_argument("--reuse-unlisted", action="store_true",
                        help="with --reuse-tuning: take its choices even where the spec no "
                             "longer lists them among the bucket's candidates (experiments; "
                             "refused otherwise)")
    args = parser.parse_args(argv)
    if args.reuse_unlisted and not args.reuse_tuning:
        parser.error("--reuse-unlisted needs --reuse-tuning")
    if args.retune_buckets and not args.reuse_tuning:
        parser.error("--retune-buckets needs --reuse-tuning (where the other buckets' configs "
                     "come from)")
    if args.tune_reps < 1:
        parser.error("--tune-reps must be at least 1")
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    try:
        build(args.specs, args.out, target=args.target, tune=not args.no_tune,
              reps=args.tune_reps, reuse_tuning=args.reuse_tuning, jobs=args.jobs,
              retune_buckets=args.retune_buckets, reuse_unlisted=args.reuse_unlisted)
    except (SpecError, BuildError, ValueError) as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
