"""Record mode's export: a ``Recording`` becomes a pack and its ``record.json``.

``export`` applies the policies of ``docs/record.md`` and says every decision: compiles
only benchmarked by an autotuner are not exported; one pack kernel per function and
configuration (``NAME__cfg<k>`` where several), its specializations the variants plus
the recorder's generic builds; an autotuned function one kernel bucketed on its key
(``record_autotune`` plans the buckets); what the pack writer refuses is refused per
variant or kernel, never for the whole export; name collisions, pre-hooks and grid
tolerance are said and listed.
"""

import dataclasses
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from kpack_tools import record_autotune
from kpack_tools.pack import Kernel, Variant, build_manifest, check_variant, write_pack
from kpack_tools.pack_dispatch import MAX_BUCKETS
from kpack_tools.param_types import INTEGER_TYPES, is_tensordesc
from kpack_tools.record_data import (TUNED_OPTIONS, CompileRecord, Recording, config_key,
                                     param_role, specialization)

RECORD_FILE = "record.json"
RECORD_FORMAT = "kpack-record/1"
# i32 before i64 before u64: the order the runtime prefers and Triton's JIT
# assigns (the narrowest type that holds the value).
_INT_ORDER = {"i32": 0, "i64": 1, "u64": 2}
_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.]")
_MAX_VARIANT_NAME = 120


def _int_rank(ty: str) -> int:
    return _INT_ORDER.get(ty, len(_INT_ORDER))


@dataclass
class ExportReport:
    """What ``export`` did, as lines for the user and data for tests."""

    manifest: Optional[Mapping[str, Any]]
    record: Mapping[str, Any]
    lines: List[str]


def check_out(out: Path, force: bool) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise FileExistsError(f"kpack record: {out} exists and is not empty; pass --force "
                              f"(force=True) to replace it")


def _variant_name(arg_names, assumptions, retyped) -> str:
    parts = []
    for name in arg_names:
        for kind in assumptions.get(name, ()):
            parts.append(f"{name}.{'d16' if kind == 'div16' else kind}")
        if name in retyped:
            parts.append(f"{name}.{retyped[name]}")
    return "-".join(parts) or "generic"


def _summarize_spec(assumptions, types) -> str:
    parts = [f"{kind}({','.join(p for p, k in assumptions.items() if kind in k)})"
             for kind in ("div16", "eq1") if any(kind in k for k in assumptions.values())]
    parts += [f"{p}:{t}" for p, t in types.items()]
    return " ".join(parts) or "no assumptions"


def _function_names(functions: Sequence[Tuple[str, str, str]], records) -> Dict[Tuple, str]:
    """Pack kernel base name per function: ``__name__`` when unique, else the
    module-qualified name, else that plus ``__src<k>`` (same name, different
    source: a redefinition)."""
    by_name: Dict[str, List[Tuple]] = {}
    for fid in functions:
        by_name.setdefault(records[fid].function, []).append(fid)
    names = {}
    for short, fids in by_name.items():
        if len(fids) == 1:
            names[fids[0]] = _NAME_UNSAFE.sub("_", short)
            continue
        by_qual: Dict[str, List[Tuple]] = {}
        for fid in fids:
            by_qual.setdefault(_NAME_UNSAFE.sub("_", f"{fid[0]}.{fid[1]}"), []).append(fid)
        for qual, same in by_qual.items():
            for k, fid in enumerate(same, start=1):
                names[fid] = qual if len(same) == 1 else f"{qual}__src{k}"
    return {fid: (n if re.match(r"[A-Za-z_]", n) else f"k_{n}") for fid, n in names.items()}


def export(recording: Recording, out, force: bool = False,
           log: Optional[Callable[[str], None]] = print,
           grid_tolerant: Sequence[str] = ()) -> ExportReport:
    """Write ``recording`` as a pack (plus ``record.json``) to ``out``.

    Policy (docs/record.md): compiles only benchmarked by the autotuner are not
    exported; one kernel per (function, config), except that an autotuned
    function is one kernel bucketed on its key; several configs of a function
    that no autotuner chose between become ``<name>__cfg<k>``; compiles the
    format cannot express, and variants or kernels the pack writer refuses,
    are refused by name while the rest is written.  Every decision is logged.
    ``grid_tolerant``: function names (``__name__`` or ``module.qualname``) or
    exported kernel names whose kernels get ``grid_tolerance`` ``{"proof":
    "asserted"}`` -- the caller's word, which recording cannot check; a name
    that matches nothing is an error.  Raises ValueError when nothing is
    exportable.
    """
    import triton
    log = log or (lambda line: None)
    lines: List[str] = []

    def say(line: str) -> None:
        lines.append(line)
        log(line)

    out = Path(out)
    check_out(out, force)
    not_exported = []
    for text in recording.unrecordable:
        say(f"not exported: {text}")
        not_exported.append({"what": text, "reason": "compiled from IR"})

    first_use = {}
    for launch in recording.launches:
        first_use.setdefault(launch.hash, launch.seq)
    position = {h: i for i, h in enumerate(recording.compiles)}
    order = sorted(recording.compiles.values(),
                   key=lambda c: (first_use.get(c.hash, math.inf), position[c.hash]))
    exportable = []
    for record in order:
        where = f"{record.module}.{record.qualname} (compile {record.hash[:12]})"
        if record.problems:
            for problem in record.problems:
                say(f"REFUSED {where}: {problem}")
            not_exported.append({"function": f"{record.module}.{record.qualname}",
                                 "hash": record.hash, "reason": "; ".join(record.problems)})
            continue
        if not recording.launch_counts.get(record.hash) and recording.bench_counts.get(record.hash):
            say(f"not exported: {where}: an autotuning candidate ({_config_summary(record)}) "
                f"only launched by the autotuner's benchmark, never chosen")
            not_exported.append({"function": f"{record.module}.{record.qualname}",
                                 "hash": record.hash, "reason": "autotuning candidate, not chosen"})
            continue
        exportable.append(record)
    if not exportable:
        raise ValueError("kpack record: nothing to export: no Triton kernel compiled by the "
                         "program could be exported" + (" (see the lines above)" if lines else ""))

    functions: Dict[Tuple, List[CompileRecord]] = {}
    for record in exportable:
        functions.setdefault(record.function_id, []).append(record)
    first = {fid: records[0] for fid, records in functions.items()}
    base_names = _function_names(list(functions), first)
    for short in {r.function for r in first.values()}:
        clashing = [fid for fid in functions if first[fid].function == short]
        if len(clashing) > 1:
            say(f"name collision: {len(clashing)} different functions are called '{short}'; "
                f"exported as " + ", ".join(f"'{base_names[f]}' ({f[0]}.{f[1]})" for f in clashing))

    exports: List[_Exported] = []
    for fid, records in functions.items():
        said: set = set()
        groups = [(group, _known_key(tuner, records[0], say, said))
                  for group, tuner in _kernel_groups(records, recording)]
        if len(groups) > 1:
            say(f"'{base_names[fid]}': {len(groups)} configurations compiled for the same "
                f"function that no autotuner chose between; kpack cannot choose between "
                f"configurations by argument values, so each becomes its own kernel:")
        for k, (group, tuner) in enumerate(groups, start=1):
            name = base_names[fid] if len(groups) == 1 else f"{base_names[fid]}__cfg{k}"
            if len(groups) > 1:
                say(f"  '{name}': {_config_summary(group[0])}")
            exports.extend(_export_group(name, group, tuner, recording, say, not_exported))
    for note in recording.notes:
        say(f"note: {note}")
    if not exports:
        raise ValueError("kpack record: nothing to export: every kernel the program compiled "
                         "was refused (see the lines above)")

    tolerant = _mark_grid_tolerant(exports, grid_tolerant, say)
    generator = f"kpack_tools.record (triton {triton.__version__})"
    manifest = write_pack(out, [e.kernel for e in exports], generator=generator)
    launch_kernel = {h: e for e in exports for h in e.launch_variant}
    launches = []
    for x in sorted(recording.launches, key=lambda x: x.seq):
        exported = launch_kernel.get(x.hash)
        if exported is None:
            continue
        variant = exported.launch_variant[x.hash]
        if isinstance(variant, Mapping):  # autotuned: the exact bucket of its key
            variant = variant.get(_key_text(exported.key_params, x.autotune_key))
            if variant is None:  # that variant was refused
                continue
        launches.append({"kernel": exported.kernel.name, "variant": variant, "grid": x.grid,
                         "args": x.args, "pre_hook": x.pre_hook,
                         **({"autotune_key": x.autotune_key} if x.autotune_key else {})})
    record_json = {
        "format": RECORD_FORMAT, "generator": generator,
        "triton_version": recording.triton_version,
        "kernels": [entry for e in exports for entry in e.entries],
        "autotuned": [e.autotune for e in exports if e.autotune is not None],
        "launches": launches,
        "not_exported": not_exported,
        "grid_tolerant": tolerant,
    }
    (out / RECORD_FILE).write_text(json.dumps(record_json, indent=1) + "\n", encoding="utf-8")
    variants = sum(len(e.kernel.variants) for e in exports)
    say(f"wrote {out}: {len(exports)} kernels, {variants} variants, "
        f"{len(record_json['launches'])} launches in {RECORD_FILE}"
        + (f"; {len(not_exported)} not exported (listed in {RECORD_FILE})"
           if not_exported else ""))
    return ExportReport(manifest=manifest, record=record_json, lines=lines)


def _mark_grid_tolerant(exports, names: Sequence[str], say) -> List[str]:
    """Gives the kernels ``names`` designate (by kernel name, function ``__name__`` or
    ``module.qualname``) ``grid_tolerance`` {"proof": "asserted"}; returns their names."""
    marked = []
    for name in names:
        hits = [e for e in exports if name == e.kernel.name or (
            e.kernel.source is not None
            and name in (e.kernel.source["qualname"], e.kernel.source["qualname"].rsplit(".")[-1]))]
        if not hits:
            raise ValueError(f"kpack record: --grid-tolerant {name!r} matches no exported "
                             f"kernel (kernels: {', '.join(e.kernel.name for e in exports)})")
        for e in hits:
            if e.kernel.name in marked:
                continue
            e.kernel = dataclasses.replace(e.kernel, grid_tolerance={"proof": "asserted"})
            marked.append(e.kernel.name)
            say(f"grid tolerance asserted for kernel '{e.kernel.name}' (unproven: recording "
                f"cannot check it; a CUDA graph may launch it with a larger grid)")
    return marked


@dataclass
class _Exported:
    """One pack kernel from a recording, and what record.json says about it."""

    kernel: Kernel
    entries: List[Dict[str, Any]]        # record.json "kernels", one per variant
    # compile hash -> the variant its launches selected; for an autotuned kernel
    # {key text: variant}, the exact bucket of the launch's key.
    launch_variant: Dict[str, Any]
    key_params: Sequence[str] = ()       # autotuned: the bucketed key parameters
    autotune: Optional[Dict[str, Any]] = None


def _autotune_info(record: CompileRecord, recording: Recording) -> Optional[Dict[str, Any]]:
    """What the autotuner recorded for a compile (for a recorder-compiled generic
    build, for the compile it is the generic build of)."""
    return recording.autotune.get(record.generated_from or record.hash)


def _kernel_groups(records, recording):
    """The pack kernels of one function: ``[(records, tuner)]``.  Compiles launched by an
    autotuner are grouped by their configuration minus what the autotuner's configs set
    (``tuner`` = ``{"keys", "tuned"}``): one kernel whose buckets reproduce its choices.
    Other compiles are grouped by their whole configuration (``tuner`` None)."""
    groups: Dict[str, Tuple[List[CompileRecord], Optional[Dict[str, Any]]]] = {}
    for record in records:
        info = _autotune_info(record, recording)
        if info is None:
            groups.setdefault("plain" + config_key(record), ([], None))[0].append(record)
        else:
            tuner = {"keys": info["keys"], "tuned": info["tuned"]}
            groups.setdefault("tuned" + config_key(record, ignore=info["tuned"]),
                              ([], tuner))[0].append(record)
    return list(groups.values())


def _known_key(tuner, record: CompileRecord, say, said: set) -> Optional[Dict[str, Any]]:
    """``tuner`` with its key names restricted to the kernel's parameters, as Triton's
    autotuner uses them (it ignores a name that is no parameter of the function; a typo in
    a tutorial's key does that): each name left out is said once (``said``: the lines
    already said for this function)."""
    if tuner is None:
        return None
    keys = []
    for name in tuner["keys"]:
        if name in record.arg_names:
            keys.append(name)
            continue
        function = f"{record.module}.{record.qualname}"
        if any(n.startswith(name + ".") for n in record.arg_names):
            line = (f"WARNING: {function}: triton.autotune key '{name}' is a tuple "
                    f"parameter, which a pack's autotune_key cannot name (its elements are "
                    f"parameters of their own); it is left out of the kernel's key")
        else:
            line = (f"WARNING: {function}: triton.autotune key '{name}' names no parameter "
                    f"of the function; Triton's autotuner ignores it, and so does kpack")
        if line not in said:
            said.add(line)
            say(line)
    return dict(tuner, keys=keys)


def _export_group(name, group, tuner, recording, say, not_exported) -> List[_Exported]:
    """The pack kernel(s) of one group of compiles (``_kernel_groups``)."""
    configs: Dict[str, List[CompileRecord]] = {}
    for record in group:
        configs.setdefault(config_key(record), []).append(record)
    if tuner is None or len(configs) == 1:
        exported = _plain_kernel(name, group, recording, say, not_exported,
                                 tuner["keys"] if tuner else None)
        return [exported] if exported else []
    exported, why_not = _autotuned_kernel(name, list(configs.values()), tuner["keys"],
                                          recording, say, not_exported)
    if exported is not None:
        return [exported]
    if why_not is None:  # refused (said and listed)
        return []
    say(f"'{name}': {len(configs)} configurations chosen by the autotuner over key "
        f"{tuner['keys']}, but {why_not}; each configuration becomes its own kernel:")
    out = []
    for k, records in enumerate(configs.values(), start=1):
        say(f"  '{name}__cfg{k}': {_config_summary(records[0])}")
        exported = _plain_kernel(f"{name}__cfg{k}", records, recording, say, not_exported,
                                 tuner["keys"])
        if exported:
            out.append(exported)
    return out


def _specializations(name, records, say, not_exported):
    """``[(record, assumptions, int types)]`` of distinct specializations (a compile that
    repeats another's is reported and dropped) and the kernel's declared integer type
    of each integer parameter: the narrowest seen."""
    specs = []
    seen = {}
    for record in records:
        assumptions, types = specialization(record)
        key = (config_key(record), json.dumps(assumptions, sort_keys=True),
               json.dumps(types, sort_keys=True))
        if key in seen:
            say(f"not exported: '{name}' compile {record.hash[:12]}: same specialization and "
                f"configuration as compile {seen[key].hash[:12]} (they differ only in "
                f"environment-dependent compile settings); the earlier one is kept")
            not_exported.append({"function": f"{record.module}.{record.qualname}",
                                 "hash": record.hash, "reason": "duplicate specialization"})
            continue
        seen[key] = record
        specs.append((record, assumptions, types))
    base_types = {}
    for pname in records[0].arg_names:
        observed = [types[pname] for _, _, types in specs if pname in types]
        if observed:
            base_types[pname] = min(observed, key=_int_rank)
    return specs, base_types


def _kernel_params(rep: CompileRecord, base_types) -> List[Tuple[str, str]]:
    params = []
    for i, pname in enumerate(rep.arg_names):
        role = param_role(rep, i, pname)
        if role[0] == "constexpr":
            params.append((pname, "constexpr"))
        elif role[0] in ("int", "eq1"):
            # An int that was 1 in every compile has no observed type: i32, the type
            # Triton's JIT gives small ints.
            params.append((pname, base_types.get(pname, "i32")))
        else:
            params.append((pname, role[1]))
    return params


def _variant_of(record, assumptions, types, base_types, params, recording, vname, bucket=None):
    retyped = {p: t for p, t in types.items() if t != base_types[p]}
    # A descriptor whose block shape differs from the kernel's (another autotuning config).
    retyped.update({p: record.signature[p] for p, t in params
                    if is_tensordesc(t) and record.signature[p] != t})
    constexpr_names = [p for p, t in params if t == "constexpr"]
    return Variant(
        name=vname, cubin=recording.cubins[record.cubin_sha256], metadata=record.metadata,
        constexprs={p: record.constants.get(p) for p in constexpr_names},
        bucket=bucket, assumptions=assumptions or None, types=retyped or None), retyped


def _spec_name(record, assumptions, retyped, taken) -> str:
    vname = _variant_name(record.arg_names, assumptions, retyped)
    return f"v{len(taken)}" if len(vname) > _MAX_VARIANT_NAME else vname


def _say_variant(say, name, vname, record, assumptions, retyped, recording, what=""):
    origin = ("; the generic build, compiled by the recorder" if record.generated_from
              else f"; {recording.launch_counts.get(record.hash, 0)} launches")
    say(f"kernel '{name}' variant '{vname}'{what}: {_summarize_spec(assumptions, retyped)}; "
        f"num_warps {record.metadata.get('num_warps')}, shared {record.metadata.get('shared')}"
        f"{origin}")
    if recording.pre_hooks.get(record.hash):
        say(f"WARNING: kernel '{name}' variant '{vname}': "
            f"{recording.pre_hooks[record.hash]} launches ran Python pre-hooks "
            f"(Config.pre_hook or add_pre_run_hook) that kpack does not run; a C++ caller "
            f"must do what they did (e.g. zero an output) before launching")


def _entry(name, vname, record, recording, launches=None) -> Dict[str, Any]:
    return {"kernel": name, "variant": vname, "hash": record.hash,
            "function": f"{record.module}.{record.qualname}",
            "launches": recording.launch_counts.get(record.hash, 0) if launches is None
            else launches,
            "launches_summarized": sum(1 for x in recording.launches if x.hash == record.hash),
            "benchmark_launches": recording.bench_counts.get(record.hash, 0),
            "launches_with_pre_hooks": recording.pre_hooks.get(record.hash, 0),
            **({"generated": "generic build compiled by the recorder"}
               if record.generated_from else {})}


def _source(record: CompileRecord) -> Optional[Dict[str, str]]:
    return {"qualname": f"{record.module}.{record.qualname}",
            "sha256": record.source_sha256} if record.source_sha256 else None


def _plain_kernel(name, records, recording, say, not_exported, autotune_key=None):
    """One pack kernel of one configuration: its specializations are the variants."""
    specs, base_types = _specializations(name, records, say, not_exported)
    params = _kernel_params(specs[0][0], base_types)
    variants, entries, launch_variant = [], [], {}
    for record, assumptions, types in specs:
        retyped = {p: t for p, t in types.items() if t != base_types[p]}
        vname = _spec_name(record, assumptions, retyped, variants)
        variant, _ = _variant_of(record, assumptions, types, base_types, params, recording,
                                 vname)
        variants.append(variant)
        entries.append(_entry(name, vname, record, recording))
        launch_variant[record.hash] = vname
        _say_variant(say, name, vname, record, assumptions, retyped, recording)
    kernel = Kernel(name=name, params=params, variants=variants, source=_source(records[0]),
                    autotune_key=list(autotune_key) if autotune_key else None)
    kernel = _validated(kernel, records, say, not_exported)
    if kernel is None:
        return None
    if not any(not v.assumptions for v in kernel.variants):
        say(f"note: kernel '{name}' has no generic variant (its generic build could not be "
            f"compiled): C++ calls that satisfy none of its variants' assumptions are "
            f"refused with INVALID_ARGUMENT")
    kept = {v.name for v in kernel.variants}
    return _Exported(kernel, [e for e in entries if e["variant"] in kept],
                     {h: v for h, v in launch_variant.items() if v in kept})


def _key_text(params, key) -> str:
    return json.dumps([(key or {}).get(p) for p in params])


def _autotuned_kernel(name, configs, keys, recording, say, not_exported):
    """One pack kernel for an autotuned function whose autotuner chose ``configs`` (lists
    of compiles, one list per configuration): buckets over the key's integer call
    parameters (``record_autotune``).  Returns ``(exported, None)``, ``(None, why)`` when
    the recording cannot be reproduced by buckets, or ``(None, None)`` when refused."""
    everything = [r for records in configs for r in records]
    specs, base_types = _specializations(name, everything, say, not_exported)
    params = _kernel_params(specs[0][0], base_types)
    integer = {p for p, t in params if t in INTEGER_TYPES}
    # Every key value the autotuner was launched for, and the configuration it chose.
    chosen: Dict[str, Tuple[Dict[str, Any], int]] = {}  # key text (all names) -> (key, cfg)
    for c, records in enumerate(configs):
        for record in records:
            info = recording.autotune.get(record.hash)
            for key, _ in (info["values"] if info else ()):
                text = json.dumps(key, sort_keys=True)
                if text in chosen and chosen[text][1] != c:
                    return None, f"key {key} was run with two configurations"
                chosen.setdefault(text, (key, c))
    dims = [k for k in keys if k in integer and all(
        isinstance(key.get(k), int) and not isinstance(key.get(k), bool)
        for key, _ in chosen.values())]
    if not dims:
        return None, (f"no key parameter is an integer call parameter to bucket on "
                      f"(key {keys})")
    recorded: List[Tuple[int, ...]] = []
    config_of: List[int] = []
    for key, c in chosen.values():
        point = tuple(key[d] for d in dims)
        if point in recorded:
            if config_of[recorded.index(point)] != c:
                return None, (f"keys that differ only in {[k for k in keys if k not in dims]} "
                              f"(not integer call parameters) were run with different "
                              f"configurations")
            continue
        recorded.append(point)
        config_of.append(c)
    plan = record_autotune.plan(dims, recorded, MAX_BUCKETS)
    if plan is None:
        return None, f"its {len(recorded)} recorded keys would need more than {MAX_BUCKETS} buckets"

    by_config: List[List[Tuple[CompileRecord, Dict, Dict]]] = [[] for _ in configs]
    index_of = {id(r): c for c, records in enumerate(configs) for r in records}
    for spec in specs:
        by_config[index_of[id(spec[0])]].append(spec)
    say(f"kernel '{name}': autotuned over key {keys}; {len(configs)} configurations chosen "
        f"for {len(recorded)} recorded key values, dispatched by buckets on {dims} "
        f"({len(plan.buckets)} buckets; unseen values use the nearest recorded key's "
        f"configuration, in variants named '..._near<k>_...'):")
    for n, point in enumerate(recorded):
        say(f"  key{n} {dict(zip(dims, point))}: {_config_summary(configs[config_of[n]][0])}")
    variants, entries = [], []
    launch_variant: Dict[str, Dict[str, str]] = {}
    names: Dict[int, str] = {}  # id(record) -> specialization part of the variant name
    for bucket in plan.buckets:
        prefix = "b" + "_".join(str(i) for i in bucket.index) + \
            (f"_key{bucket.key}_" if bucket.exact else f"_near{bucket.key}_")
        for record, assumptions, types in by_config[config_of[bucket.key]]:
            retyped = {p: t for p, t in types.items() if t != base_types[p]}
            part = names.setdefault(id(record), _spec_name(record, assumptions, retyped,
                                                           names))
            vname = prefix + part
            variant, _ = _variant_of(record, assumptions, types, base_types, params,
                                     recording, vname, bucket=list(bucket.index))
            variants.append(variant)
            if not bucket.exact:
                continue
            key = dict(zip(dims, recorded[bucket.key]))
            launches = sum(n for k, n in (recording.autotune.get(record.hash) or
                                          {"values": []})["values"]
                           if all(k.get(d) == key[d] for d in dims))
            entries.append(_entry(name, vname, record, recording, launches))
            launch_variant.setdefault(record.hash, {})[_key_text(dims, key)] = vname
    for c, specs_c in enumerate(by_config):
        for record, assumptions, types in specs_c:
            retyped = {p: t for p, t in types.items() if t != base_types[p]}
            _say_variant(say, name, f"*_{names[id(record)]}", record, assumptions, retyped,
                         recording, f" (configuration of key{config_of.index(c)})"
                         if c in config_of else "")
    kernel = Kernel(name=name, params=params, variants=variants,
                    buckets=[{"param": p, "edges": e} for p, e in plan.dims],
                    source=_source(everything[0]), autotune_key=list(keys))
    kernel = _validated(kernel, everything, say, not_exported)
    if kernel is None:
        return None, None
    kept = {v.name for v in kernel.variants}
    autotune = {
        "kernel": name, "key": list(keys), "bucketed": dims,
        "policy": "a key value the program used selects the configuration the autotuner "
                  "chose for it (variants b<i>_key<k>_*); any other selects the nearest "
                  "recorded key's (b<i>_near<k>_*): per parameter the nearest recorded "
                  "value (a tie goes to the smaller), then the recorded key with the least "
                  "total rank distance (a tie goes to the one used first)",
        "recorded_keys": [{"key": f"key{n}", "values": dict(zip(dims, point)),
                           "constexprs": {p: configs[config_of[n]][0].constants.get(p)
                                          for p, t in params if t == "constexpr"},
                           "options": {o: configs[config_of[n]][0].options.get(o)
                                       for o in TUNED_OPTIONS}}
                          for n, point in enumerate(recorded)],
        "buckets": [{"bucket": list(b.index), "range": plan.describe(b),
                     "key": f"key{b.key}", "exact": b.exact} for b in plan.buckets],
    }
    return _Exported(kernel, [e for e in entries if e["variant"] in kept],
                     {h: {k: v for k, v in m.items() if v in kept}
                      for h, m in launch_variant.items()}, dims, autotune), None


def _validated(kernel: Kernel, records, say, not_exported) -> Optional[Kernel]:
    """``kernel`` if the pack writer accepts it; else without the variants it refuses
    alone; else None.  Every refusal is said and listed by name: one kernel the pack
    format cannot hold never costs the others."""
    try:
        build_manifest([kernel])
        return kernel
    except ValueError as err:
        problem = str(err)
    bad = {}
    for variant in kernel.variants:
        try:
            check_variant(kernel, variant)
        except ValueError as err:
            bad[variant.name] = str(err)
    kept = [v for v in kernel.variants if v.name not in bad]
    for vname, why in bad.items():
        say(f"REFUSED kernel '{kernel.name}' variant '{vname}': {why}")
        not_exported.append({"kernel": kernel.name, "variant": vname, "reason": why})
    if bad and kept:
        try:
            smaller = dataclasses.replace(kernel, variants=kept)
            build_manifest([smaller])
            return smaller
        except ValueError as err:
            problem = str(err)
    functions = sorted({f"{r.module}.{r.qualname}" for r in records})
    say(f"REFUSED kernel '{kernel.name}' ({', '.join(functions)}): {problem}")
    not_exported.append({"kernel": kernel.name, "function": ", ".join(functions),
                         "hashes": [r.hash for r in records], "reason": problem})
    return None


def _config_summary(record: CompileRecord) -> str:
    constexprs = {n: record.constants.get(n) for i, n in enumerate(record.arg_names)
                  if param_role(record, i, n)[0] == "constexpr"}
    opts = {k: record.options[k] for k in ("num_warps", "num_stages", "num_ctas", "maxnreg")
            if record.options.get(k) is not None}
    types = {n: record.signature[n] for i, n in enumerate(record.arg_names)
             if param_role(record, i, n)[0] == "type"}
    return f"constexprs {constexprs}, options {opts}, types {types}"
