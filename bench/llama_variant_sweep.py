#!/usr/bin/env python3
"""Choose Llama kernel configs by the step time of the whole decode step graph.

kpack-build's tuner times each kernel alone. Inside the step graph, a kernel's programs
start under PDL while the kernel before it ends (docs/llama.md), and which config is
fastest there can differ: on the H200 (2026-12-02) the down projection at M = 1 over 16
warps timed 10.8 µs alone in the tuner (the 4-warp config it had picked before: 9.5), yet
in the step graph it saved 7.2 µs per step against that config.
This script measures that, in two steps:

``build`` (no GPU): for each line ``TAG KERNEL BUCKET CONFIG [NAME=VALUE,...]`` of a
variants file, a pack of that one kernel whose bucket BUCKET uses CONFIG (a config of
kernels/llama/llama_spec.py) and its other buckets the committed pack's tuning; the
optional edits set module constants of llama_kernels.py (``NAME = tl.constexpr(N)``) in
a copy of the kernel source, for experiments on the code itself.

``time`` (the H200): each variant spliced into a copy of the committed pack (that
kernel's manifest entry and cubins replaced; ``A+B`` splices several), then
``kpack-llama`` runs the Llama protocol (prompt 32, 127 steps, capacity 16,384, step
graphs) at ``--batch``, or with ``--context N`` a grid cell as ``bench/llama_bench.py``
times it (64 steps after a synthetic context of N positions: the contexts where decode
attention's configs differ); ``--rounds`` rounds, every other one in reverse order, the
unswapped pack timed before every fourth variant. Prints each variant's median µs/step
and its difference from the unswapped pack's median, and writes sweep.json.

    python3 bench/llama_variant_sweep.py build --variants FILE --out DIR [--jobs 2]
    python3 bench/llama_variant_sweep.py time --kpack-llama BIN --checkpoint DIR \\
        --variants-dir DIR --out DIR [--batch 1] [--context N] [--rounds 2] \\
        [--only TAG,TAG+TAG]

A variant pack may be a whole pack: with ``--pack`` an older pack and a variant directory
holding a copy of the tree's (every kernel spliced in: the tree's manifest and cubins),
``time`` pairs the two packs in one process, at the protocol or a grid cell.

``splice`` (no GPU) writes one such spliced pack to a directory, for the benchmarks that
take ``--pack``: ``llama_breakdown.py`` times the step graph with and without programmatic
edges in one process, which ``time`` cannot (``kpack-llama`` follows the engine's edge
policy; session 6 measured the trigger-at-exit kernels at batch 4-64 that way).

    python3 bench/llama_variant_sweep.py splice --variants-dir DIR --tags TAG+TAG --out DIR

A chosen config goes into the spec as its bucket's only candidate (a pinned list, so that
a later tuning keeps it); the pack is rebuilt with the pin on any machine
(``kpack_tools.build ... --no-tune --reuse-tuning kernels/llamapack/tuning.json
--retune-buckets KERNEL:BUCKET``, docs/build-spec.md), then proven on the GPU with
``LLAMA_TUNE_GROUPS=KERNEL LLAMA_TUNE_BUCKETS=none tools/gpu_tier.sh llama-tune`` (the
grid-tolerance proof; the correctness check is the Llama tier's).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SPEC_DIR = REPO / "kernels" / "llama"
PACK = REPO / "kernels" / "llamapack"
# A grid cell's decode steps after its synthetic context (bench/llama_bench.py's default).
GRID_STEPS = 64
# kpack_tools (the build's config JSON), the spec and the Python engine's config (a grid
# cell's capacity), imported where used: `time` needs no Triton.
for _path in (REPO / "tools", SPEC_DIR, REPO / "examples" / "llama" / "python"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))


class SweepError(Exception):
    pass


def read_variants(path: Path) -> list[dict]:
    """The variants file's lines (# comments and blank lines skipped), checked."""
    out, tags = [], set()
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        where = f"{path}:{number}"
        if len(words) not in (4, 5):
            raise SweepError(f"{where}: expected TAG KERNEL BUCKET CONFIG [NAME=VALUE,...], "
                             f"got {line.strip()!r}")
        tag, kernel, bucket, config = words[:4]
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", tag) or tag in tags:
            raise SweepError(f"{where}: tag {tag!r} must be unique and a plain file name")
        if not bucket.isdigit():
            raise SweepError(f"{where}: bucket {bucket!r} is not a bucket index")
        edits = {}
        for edit in (words[4].split(",") if len(words) == 5 else []):
            name, _, value = edit.partition("=")
            if not re.fullmatch(r"_?[A-Z][A-Z0-9_]*", name) or not value.isdigit():
                raise SweepError(f"{where}: source edit {edit!r} is not NAME=INTEGER")
            edits[name] = int(value)
        tags.add(tag)
        out.append({"tag": tag, "kernel": kernel, "bucket": int(bucket), "config": config,
                    "edits": edits})
    if not out:
        raise SweepError(f"{path}: no variants")
    return out


def edited_source(text: str, edits: dict) -> str:
    """llama_kernels.py with each NAME = tl.constexpr(N) set to its new value."""
    for name, value in edits.items():
        text, n = re.subn(rf"^{re.escape(name)} = tl\.constexpr\(\d+\)",
                          f"{name} = tl.constexpr({value})", text, flags=re.M)
        if n != 1:
            raise SweepError(f"llama_kernels.py has no constant `{name} = tl.constexpr(N)`")
    return text


def variant_tuning(base: dict, specs: dict, v: dict) -> dict:
    """The committed tuning.json with the variant's bucket choosing its config."""
    from kpack_tools.build import _config_json  # noqa: PLC0415
    if v["kernel"] not in specs:
        raise SweepError(f"variant {v['tag']}: no kernel {v['kernel']!r} in the spec "
                         f"({', '.join(specs)})")
    spec = specs[v["kernel"]]
    try:
        config = spec.config(v["config"])
    except Exception as e:  # noqa: BLE001 - the spec's own error names the config
        raise SweepError(f"variant {v['tag']}: {e}") from None
    tuning = json.loads(json.dumps(base))
    entry = next(k for k in tuning["kernels"] if k["name"] == v["kernel"])
    if v["bucket"] >= len(entry["buckets"]):
        raise SweepError(f"variant {v['tag']}: {v['kernel']} has buckets 0-"
                         f"{len(entry['buckets']) - 1}, not {v['bucket']}")
    entry["buckets"][v["bucket"]]["chosen"] = config.name
    if config.name not in {c["name"] for c in entry["configs"]}:
        entry["configs"].append(_config_json(config))
    return tuning


def build_one(v: dict, tuning: dict, out: Path, python: str) -> tuple[str, int, str]:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        spec = SPEC_DIR / "llama_spec.py"
        if v["edits"]:
            shutil.copytree(SPEC_DIR, tmp / "src", ignore=shutil.ignore_patterns("__pycache__"))
            kernels = tmp / "src" / "llama_kernels.py"
            kernels.write_text(edited_source(kernels.read_text(), v["edits"]))
            spec = tmp / "src" / "llama_spec.py"
        (tmp / "tuning.json").write_text(json.dumps(tuning))
        dest = out / v["tag"]
        shutil.rmtree(dest, ignore_errors=True)
        env = dict(os.environ, LLAMA_SPEC_KERNELS=v["kernel"], PYTHONPATH=str(REPO / "tools"))
        r = subprocess.run([python, "-m", "kpack_tools.build", str(spec), "--out", str(dest),
                            "--reuse-tuning", str(tmp / "tuning.json"), "--reuse-unlisted"],
                           env=env, capture_output=True, text=True)
    return v["tag"], r.returncode, r.stderr[-1500:]


def cmd_build(args) -> int:
    variants = read_variants(args.variants)
    import llama_spec  # noqa: PLC0415
    specs = {k.name: k for k in llama_spec.ALL_KERNELS}
    base = json.loads((args.pack / "tuning.json").read_text())
    tunings = [variant_tuning(base, specs, v) for v in variants]  # every error before work
    for v in variants:
        if v["edits"]:
            edited_source((SPEC_DIR / "llama_kernels.py").read_text(), v["edits"])
    args.out.mkdir(parents=True, exist_ok=True)
    failed = 0
    with ThreadPoolExecutor(args.jobs) as pool:
        for tag, rc, err in pool.map(lambda vt: build_one(vt[0], vt[1], args.out, sys.executable),
                                     zip(variants, tunings)):
            print(f"{tag}: {'built' if rc == 0 else 'FAILED'}", flush=True)
            if rc:
                failed += 1
                print(err, file=sys.stderr)
    return 1 if failed else 0


def splice(base: Path, variants_dir: Path, tags: list[str], dest: Path) -> Path:
    """A copy of pack `base` with the kernels of the variant packs `tags` swapped in."""
    shutil.copytree(base, dest)
    manifest = json.loads((dest / "manifest.json").read_text())
    for tag in tags:
        src = variants_dir / tag
        if not (src / "manifest.json").is_file():
            raise SweepError(f"no variant pack {src} (run `build` first)")
        for kernel in json.loads((src / "manifest.json").read_text())["kernels"]:
            index = next((i for i, k in enumerate(manifest["kernels"])
                          if k["name"] == kernel["name"]), None)
            if index is None:
                raise SweepError(f"variant {tag}: pack {base} has no kernel {kernel['name']!r}")
            manifest["kernels"][index] = kernel
            shutil.rmtree(dest / "cubins" / kernel["name"], ignore_errors=True)
            shutil.copytree(src / "cubins" / kernel["name"], dest / "cubins" / kernel["name"])
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return dest


def cmd_time(args) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    if args.only:
        groups = [g.split("+") for g in args.only.split(",")]
    else:
        groups = [[p.name] for p in sorted(args.variants_dir.iterdir())
                  if (p / "manifest.json").is_file()]
    if not groups:
        raise SweepError(f"{args.variants_dir}: no variant packs")
    with tempfile.TemporaryDirectory() as tmp:
        packs = {"base": splice(args.pack, args.variants_dir, [], Path(tmp) / "base")}
        for g in groups:
            packs["+".join(g)] = splice(args.pack, args.variants_dir, g, Path(tmp) / "+".join(g))

        if args.context is None:
            shape = ["--prompt-lens", "32", "--steps", "127", "--capacity", "16384"]
        else:
            import config  # noqa: PLC0415
            capacity = config.aligned_capacity(args.context + GRID_STEPS + 1)
            shape = ["--prompt-lens", "1", "--steps", str(GRID_STEPS), "--capacity",
                     str(capacity), "--context", str(args.context)]

        def run(key: str) -> float:
            out = args.out / f"{key}.json"
            cmd = [args.kpack_llama, "--pack", str(packs[key]), "--checkpoint",
                   str(args.checkpoint), "--batch", str(args.batch), *shape, "--graphs", "on",
                   "--warmup-seqs", "1", "--timed-seqs", "4", "--json", str(out)]
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            if r.returncode:
                raise SweepError(f"{' '.join(cmd)}: exit {r.returncode}\n{r.stderr[-1500:]}")
            return json.loads(out.read_text())["us_per_step"]

        times: dict[str, list[float]] = {}
        for rnd in range(args.rounds):
            order = groups if rnd % 2 == 0 else groups[::-1]
            for i, g in enumerate(order):
                if i % 4 == 0:
                    times.setdefault("base", []).append(run("base"))
                key = "+".join(g)
                times.setdefault(key, []).append(run(key))
                print(f"round {rnd} {key}: {times[key][-1]:.1f} µs/step", flush=True)
    base = statistics.median(times["base"])
    where = "the protocol" if args.context is None else f"context {args.context}"
    print(f"\nbatch {args.batch}, {where}; unswapped pack: median {base:.1f} µs/step over "
          f"{len(times['base'])} runs")
    for key, ts in sorted(times.items(), key=lambda kv: statistics.median(kv[1])):
        med = statistics.median(ts)
        print(f"{key:32s} {med:8.1f} {med - base:+7.1f}  {[round(t, 1) for t in ts]}")
    (args.out / "sweep.json").write_text(json.dumps(
        {"batch": args.batch, "context": args.context, "rounds": args.rounds,
         "us_per_step": times}, indent=1) + "\n")
    return 0


def cmd_splice(args) -> int:
    if args.out.exists():
        raise SweepError(f"{args.out} exists: give a new directory")
    tags = [t for t in args.tags.split("+") if t]
    if not tags:
        raise SweepError("--tags names no variant")
    try:
        splice(args.pack, args.variants_dir, tags, args.out)
    except SweepError:
        shutil.rmtree(args.out, ignore_errors=True)
        raise
    print(f"{args.out}: {args.pack} with {', '.join(tags)} spliced in")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="variant packs (no GPU)")
    b.add_argument("--variants", type=Path, required=True)
    b.add_argument("--out", type=Path, required=True)
    b.add_argument("--pack", type=Path, default=PACK, help="whose tuning.json the rest follows")
    b.add_argument("--jobs", type=int, default=2)
    t = sub.add_parser("time", help="each variant's step time (the H200)")
    t.add_argument("--kpack-llama", required=True)
    t.add_argument("--checkpoint", type=Path, required=True)
    t.add_argument("--variants-dir", type=Path, required=True)
    t.add_argument("--out", type=Path, required=True)
    t.add_argument("--pack", type=Path, default=PACK)
    t.add_argument("--batch", type=int, default=1)
    t.add_argument("--context", type=int, default=None, metavar="N",
                   help="time a grid cell: 64 steps after a synthetic context of N positions "
                        "(default: the Llama protocol)")
    t.add_argument("--rounds", type=int, default=2)
    t.add_argument("--only", default="", help="TAG,TAG+TAG,... (default: every variant pack)")
    sp = sub.add_parser("splice", help="one spliced pack, for benchmarks that take --pack")
    sp.add_argument("--variants-dir", type=Path, required=True)
    sp.add_argument("--tags", required=True, help="TAG or TAG+TAG+...")
    sp.add_argument("--out", type=Path, required=True)
    sp.add_argument("--pack", type=Path, default=PACK)
    args = ap.parse_args(argv)
    if getattr(args, "context", None) is not None and args.context < 1:
        ap.error(f"--context must be a positive number of positions, not {args.context}")
    commands = {"build": cmd_build, "time": cmd_time, "splice": cmd_splice}
    try:
        return commands[args.command](args)
    except SweepError as e:
        print(f"llama_variant_sweep: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
