"""Record mode: run an unmodified Triton program and export what it compiled.

Two ways in (``docs/record.md`` has the whole contract)::

    python -m kpack_tools.record --out PACK [--force] -- python my_model.py args...

    with kpack_tools.record.Recorder(out="PACK"):
        model(x)

Every kernel Triton 3.6 compiles while recording is captured with its exact
signature, constexprs, specialization (``tt.divisibility`` 16 -> ``div16``,
ints equal to 1 compiled away -> ``eq1``, i32/i64/u64 int typing -> per-variant
``types``) and launch metadata, and every launch with its grid and a summary of
its arguments.  At export, one Python function + one configuration (constexpr
values, ``None`` arguments, non-integer argument types, compile options) is one
pack kernel, and the specializations seen are its variants, plus the generic
build the recorder compiles when recording stops.  A function under
``triton.autotune`` is one kernel whose buckets over the key reproduce the
autotuner's choices (``record_autotune``).  What the pack writer refuses is
refused per variant or kernel, never for the whole export.

This module owns the recording side: the ``Recorder`` (installing and removing the hooks,
the generic builds, the dumps of a recorded child process) and the command line.  What is
recorded, and how a compile is read, is ``kpack_tools.record_data``; the export (the
policies, recording -> pack and ``record.json``) is ``kpack_tools.record_export``, whose
``export`` this module re-exports; the buckets of autotuned functions are
``kpack_tools.record_autotune``.

Hook points (all of Triton 3.6, checked against its source):

- ``triton.knobs.compilation.listener``: called by ``triton.compile`` for every
  compilation, cache hits included, with the ``ASTSource`` (signature,
  constants, attrs), the metadata and the paths of the cached files (cubin).
- ``CompiledKernel.launch_metadata(grid, stream, *args)``: called by the JIT
  (and by ``CompiledKernel[grid]``) right before each launch with the
  evaluated grid and every argument; wrapped to count and summarize launches
  (``knobs.runtime.launch_enter_hook`` receives neither the grid nor the
  arguments in 3.6).
- ``Autotuner._bench`` and ``Autotuner.run``: wrapped to tell autotuning
  benchmark launches from real ones, to note each real launch's key values and
  to notice ``Config.pre_hook``.

Anything that depends on these is refused on another Triton version.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from kpack_tools import SUPPORTED_TRITON_VERSIONS
from kpack_tools.record_data import (LaunchRecord, Recording, arg_summaries,
                                     autotune_key_values, compile_options, compile_record,
                                     config_key, flat_params, specialization, tuned_names)
# The export's names are this module's too: `record.export(recording, "PACK")`.
from kpack_tools.record_export import (RECORD_FILE, RECORD_FORMAT, ExportReport,  # noqa: F401
                                       check_out, export)

DEFAULT_MAX_LAUNCHES = 64
# Environment of a recorded child process (set by the command line).
ENV_DIR = "KPACK_RECORD_DIR"
ENV_TOOLS = "KPACK_RECORD_TOOLS"
ENV_MAX_LAUNCHES = "KPACK_RECORD_MAX_LAUNCHES"
BOOT_DIR = Path(__file__).resolve().parent / "_record_boot"


class UnsupportedTritonVersion(RuntimeError):
    """Triton is not a version whose hook points and ABI this module knows."""


def check_triton_version(version: str) -> None:
    """Raise ``UnsupportedTritonVersion`` unless ``version`` is supported."""
    if version not in SUPPORTED_TRITON_VERSIONS:
        raise UnsupportedTritonVersion(
            f"kpack record: found Triton {version}, supported: "
            f"{', '.join(SUPPORTED_TRITON_VERSIONS)}; the recorder reads Triton's compile "
            f"and launch internals, which change between versions, so it refuses to record")



# ---------------------------------------------------------------------------
# The recorder: installs and removes the hooks
# ---------------------------------------------------------------------------

_active_lock = threading.Lock()
_active: Optional["Recorder"] = None


class Recorder:
    """Records Triton compilations and launches while active.

    As a context manager it writes the pack to ``out`` when the block exits
    (also when the block raised: then an export error is logged, not raised,
    so the block's exception is what propagates).  ``out`` may be None to
    record only; call ``export`` yourself.  One recorder is active at a time.
    ``max_launches`` caps the launches summarized per compiled kernel (all are
    counted).  ``dump_dir`` (used by the command line) makes the recorder
    write its recording there at every compilation and at exit.
    ``grid_tolerant`` names functions (or exported kernels) whose programs
    tolerate a larger grid; their kernels get the manifest's ``grid_tolerance``
    as *asserted* (``export``).
    """

    def __init__(self, out=None, force: bool = False,
                 max_launches: int = DEFAULT_MAX_LAUNCHES, dump_dir=None,
                 log: Optional[Callable[[str], None]] = print,
                 grid_tolerant: Sequence[str] = ()):
        self.out = out
        self.force = force
        self.grid_tolerant = tuple(grid_tolerant)
        self.max_launches = max_launches
        self.dump_dir = Path(dump_dir) if dump_dir is not None else None
        self.log = log or (lambda line: None)
        self.recording: Optional[Recording] = None
        self._lock = threading.RLock()
        self._local = threading.local()
        self._saved = {}
        self._seq = 0
        self._unrecordable = set()
        # hash -> (ASTSource, compile options): what the generic build of it needs.
        self._sources: Dict[str, Tuple[Any, Dict[str, Any]]] = {}

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> "Recorder":
        global _active
        import triton
        check_triton_version(triton.__version__)
        from triton import knobs
        from triton.compiler.compiler import CompiledKernel
        from triton.runtime.autotuner import Autotuner
        with _active_lock:
            if _active is not None:
                raise RuntimeError("kpack record: another Recorder is already active")
            if self.out is not None:
                check_out(Path(self.out), self.force)
            self.recording = Recording(triton_version=triton.__version__)
            previous_listener = knobs.compilation.listener
            recorder = self

            def listener(*, src, metadata, metadata_group, times, cache_hit):
                recorder._on_compile(src, metadata, metadata_group)
                if previous_listener is not None:
                    previous_listener(src=src, metadata=metadata, metadata_group=metadata_group,
                                      times=times, cache_hit=cache_hit)

            original_launch_metadata = CompiledKernel.launch_metadata
            original_bench = Autotuner._bench
            original_run = Autotuner.run

            def launch_metadata(kernel, grid, stream, *args):
                recorder._on_launch(kernel, grid, args)
                return original_launch_metadata(kernel, grid, stream, *args)

            def bench(tuner, *args, **kwargs):
                recorder._local.bench = getattr(recorder._local, "bench", 0) + 1
                try:
                    return original_bench(tuner, *args, **kwargs)
                finally:
                    recorder._local.bench -= 1

            def run(tuner, *args, **kwargs):
                stack = recorder._local.__dict__.setdefault("tuners", [])
                stack.append((tuner, autotune_key_values(tuner, args, kwargs)))
                try:
                    return original_run(tuner, *args, **kwargs)
                finally:
                    stack.pop()

            self._saved = {"listener": previous_listener,
                           "launch_metadata": original_launch_metadata,
                           "bench": original_bench, "run": original_run}
            knobs.compilation.listener = listener
            CompiledKernel.launch_metadata = launch_metadata
            Autotuner._bench = bench
            Autotuner.run = run
            _active = self
        return self

    def stop(self) -> Recording:
        global _active
        from triton import knobs
        from triton.compiler.compiler import CompiledKernel
        from triton.runtime.autotuner import Autotuner
        with _active_lock:
            if _active is self:
                self._compile_generics()
                knobs.compilation.listener = self._saved["listener"]
                CompiledKernel.launch_metadata = self._saved["launch_metadata"]
                Autotuner._bench = self._saved["bench"]
                Autotuner.run = self._saved["run"]
                _active = None
        self.dump()
        return self.recording

    def __enter__(self) -> "Recorder":
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        recording = self.stop()
        if self.out is None:
            return
        if exc_type is None:
            export(recording, self.out, force=self.force, log=self.log,
                   grid_tolerant=self.grid_tolerant)
            return
        try:
            export(recording, self.out, force=self.force, log=self.log,
                   grid_tolerant=self.grid_tolerant)
        except Exception as err:  # the block's exception must win
            self.log(f"kpack record: could not export after the recorded block failed: {err}")

    # -- hooks -------------------------------------------------------------

    def _capture(self, src, metadata, read_cubin) -> Optional[str]:
        """Record a compilation once; return its hash (None if unrecordable)."""
        h = str(metadata.get("hash", ""))
        with self._lock:
            if h and h in self.recording.compiles:
                return h
            if h in self._unrecordable:
                return None
            if not hasattr(src, "fn") or not hasattr(src.fn, "arg_names"):
                self._unrecordable.add(h)
                self.recording.unrecordable.append(
                    f"{getattr(src, 'name', src)!r} (hash {h[:12]}): compiled from IR, not "
                    f"from a @triton.jit function, so its signature is unknown")
                return None
            cubin = read_cubin()
            record = compile_record(src, metadata, cubin)
            record.generated_from = getattr(self._local, "generic_of", "")
            self.recording.compiles[record.hash] = record
            self.recording.cubins[record.cubin_sha256] = cubin
            self._sources[record.hash] = (src, compile_options(metadata))
        self.dump()
        return record.hash

    def _on_compile(self, src, metadata, metadata_group) -> None:
        def read_cubin():
            paths = [p for name, p in metadata_group.items() if name.endswith(".cubin")]
            if len(paths) != 1:
                raise RuntimeError(f"kpack record: compile of {src.name}: expected one cubin "
                                   f"in Triton's cache group, found {paths}")
            return Path(paths[0]).read_bytes()
        self._capture(src, metadata, read_cubin)

    def _on_launch(self, kernel, grid, args) -> None:
        h = kernel.hash
        if h not in self.recording.compiles:  # compiled before the recorder started
            h = self._capture(kernel.src, {**kernel.metadata._asdict(), "hash": kernel.hash},
                              lambda: bytes(kernel.asm["cubin"]))
            if h is None:
                return
        rec = self.recording
        with self._lock:
            if getattr(self._local, "bench", 0):
                rec.bench_counts[h] = rec.bench_counts.get(h, 0) + 1
                return
            tuners = getattr(self._local, "tuners", [])
            tuner, key = tuners[-1] if tuners else (None, None)
            config = getattr(tuner, "best_config", None)
            fn = getattr(kernel.src, "fn", None)
            pre_hook = bool((config is not None and config.pre_hook is not None)
                            or getattr(fn, "pre_run_hooks", None))
            count = rec.launch_counts.get(h, 0)
            rec.launch_counts[h] = count + 1
            if pre_hook:
                rec.pre_hooks[h] = rec.pre_hooks.get(h, 0) + 1
            if key is not None:
                rec.note_autotune_key(h, tuner.keys, tuned_names(tuner), key)
            if count >= self.max_launches:
                return
            grid = list(grid) + [1] * (3 - len(grid))
            names = kernel.src.fn.arg_names
            summaries = {}
            for name, value in zip(names, args):
                summaries.update(arg_summaries(name, value))
            rec.launches.append(LaunchRecord(
                seq=self._seq, hash=h, grid=[int(g) for g in grid[:3]],
                args=summaries,
                pre_hook=pre_hook, autotune_key=key))
            self._seq += 1

    def _compile_generics(self) -> None:
        """Compile the generic build (no ``div16``, no ``eq1``) of every recorded kernel
        and configuration that lacks one, as Triton's JIT would for arguments with no
        alignment and no value 1, so the pack serves any call the JIT would.  Runs while
        the hooks are installed: the listener records each build like any compile,
        marked ``generated_from``.  Autotuning candidates that were never chosen get none
        (they are not exported)."""
        import triton
        from triton.backends.compiler import GPUTarget
        from triton.compiler import ASTSource
        rec = self.recording
        have, wanted = set(), {}
        for h, record in list(rec.compiles.items()):
            if record.problems or (not rec.launch_counts.get(h) and rec.bench_counts.get(h)):
                continue
            assumptions, types = specialization(record)
            generic_types = {n: t for n, t in types.items()}
            generic_types.update({n: "i32" for n, kinds in assumptions.items() if "eq1" in kinds})
            key = (record.function_id, config_key(record),
                   json.dumps(generic_types, sort_keys=True))
            if not assumptions:
                have.add(key)
            elif h in self._sources:
                wanted.setdefault(key, (h, generic_types))
        for key, (h, generic_types) in wanted.items():
            if key in have:
                continue
            src, options = self._sources[h]
            record = rec.compiles[h]
            # The recorded compile's signature and constants with the generic integer types
            # at the (flattened) parameters' paths.
            paths = {name: path for name, path, _ in
                     flat_params(list(src.fn.arg_names), src.signature)}
            signature = dict(src.signature)
            for name, ty in generic_types.items():
                path = paths[name]
                signature[src.fn.arg_names[path[0]]] = _with_type_at(
                    signature[src.fn.arg_names[path[0]]], path[1:], ty)
            generic_paths = {paths[name] for name in generic_types}
            constexprs = {path: value for path, value in src.constants.items()
                          if tuple(path) not in generic_paths}
            target = record.metadata.get("target") or {}
            self._local.generic_of = h
            try:
                triton.compile(ASTSource(src.fn, signature, constexprs, attrs={}),
                               target=GPUTarget("cuda", target.get("arch"),
                                                target.get("warp_size", 32)),
                               options=options)
            except Exception as err:  # noqa: BLE001 - recorded, and said at export
                rec.notes.append(f"{record.module}.{record.qualname} (compile {h[:12]}): its "
                                 f"generic build failed: {type(err).__name__}: "
                                 f"{str(err).strip().splitlines()[0] if str(err).strip() else ''}")
            finally:
                self._local.generic_of = ""

    def dump(self) -> None:
        """Write the recording to ``dump_dir`` (command-line mode only)."""
        if self.dump_dir is None or self.recording is None:
            return
        with self._lock:
            cubin_dir = self.dump_dir / "cubins"
            cubin_dir.mkdir(parents=True, exist_ok=True)
            for sha, data in self.recording.cubins.items():
                path = cubin_dir / f"{sha}.cubin"
                if not path.exists():
                    path.write_bytes(data)
            target = self.dump_dir / f"{os.getpid()}.json"
            tmp = target.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.recording.to_json()), encoding="utf-8")
            tmp.replace(target)


def _with_type_at(ty, path, new):
    """``ty`` (a type or a tuple of them) with the element at ``path`` replaced by ``new``."""
    if not path:
        return new
    items = list(ty)
    items[path[0]] = _with_type_at(items[path[0]], path[1:], new)
    return tuple(items)


def load_dumps(dump_dir) -> Tuple[Optional[Recording], List[str]]:
    """Merge the recordings the processes of a recorded program dumped, and
    return ``(recording or None, errors the processes reported)``."""
    dump_dir = Path(dump_dir)
    errors = [p.read_text(encoding="utf-8").strip() for p in sorted(dump_dir.glob("*.error"))]
    cubins = {p.stem: p.read_bytes() for p in (dump_dir / "cubins").glob("*.cubin")} \
        if (dump_dir / "cubins").is_dir() else {}
    merged = None
    for path in sorted(dump_dir.glob("*.json"), key=lambda p: int(p.stem)):
        recording = Recording.from_json(json.loads(path.read_text(encoding="utf-8")), cubins)
        if merged is None:
            merged = recording
        else:
            merged.merge(recording)
    return merged, errors



# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def _exit_status(returncode: int) -> int:
    """A child's status as a shell reports it (128 + signal for a signal)."""
    return 128 - returncode if returncode < 0 else returncode


def main(argv=None, prog: str = "python -m kpack_tools.record") -> int:
    """The command line; ``prog`` is how it was started (``kpack-record`` from the console
    script)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Run a Triton program unmodified and export every kernel it compiled "
                    "into a kpack pack (docs/record.md).",
        usage="%(prog)s --out PACK [--force] [--max-launches N] [--grid-tolerant NAME] "
              "-- COMMAND [ARGS...]")
    parser.add_argument("--out", required=True, help="pack directory to write")
    parser.add_argument("--force", action="store_true", help="replace an existing --out")
    parser.add_argument("--max-launches", type=int, default=DEFAULT_MAX_LAUNCHES,
                        help=f"launches summarized in {RECORD_FILE} per compiled kernel "
                             f"(default {DEFAULT_MAX_LAUNCHES}; all are counted)")
    parser.add_argument("--grid-tolerant", action="append", default=[], metavar="NAME",
                        help="a function (name or module.qualname) or exported kernel whose "
                             "programs tolerate a larger grid: its kernels get grid_tolerance "
                             "as asserted (repeatable; docs/record.md)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the program to run")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given: put the program after --")
    try:
        check_out(Path(args.out), args.force)
    except FileExistsError as err:
        print(err, file=sys.stderr)
        return 2

    with tempfile.TemporaryDirectory(prefix="kpack-record-") as dump_dir:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(BOOT_DIR)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        env[ENV_DIR] = dump_dir
        env[ENV_TOOLS] = str(Path(__file__).resolve().parents[1])
        env[ENV_MAX_LAUNCHES] = str(args.max_launches)
        try:
            child = subprocess.Popen(command, env=env)
        except OSError as err:
            print(f"kpack record: cannot run {command[0]!r}: {err}", file=sys.stderr)
            return 127
        # Ctrl-C reaches the program (same process group); we wait for it and export.
        # (Ignored only after the start: an ignored SIGINT would be inherited.)
        old = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            returncode = child.wait()
        finally:
            signal.signal(signal.SIGINT, old)
        status = _exit_status(returncode)
        recording, errors = load_dumps(dump_dir)
        for error in errors:
            print(error, file=sys.stderr)
        if errors:
            print("kpack record: the recorder failed in the program (above); no pack written",
                  file=sys.stderr)
            return status or 1
        if status != 0:
            print(f"kpack record: the program exited with status {status}; exporting what "
                  f"was recorded before that", file=sys.stderr)
        if recording is None or not recording.compiles:
            print("kpack record: nothing recorded: the program compiled no Triton kernel "
                  "(or ran no Python with Triton); no pack written", file=sys.stderr)
            return status or 1
        try:
            export(recording, args.out, force=args.force, grid_tolerant=args.grid_tolerant)
        except (ValueError, FileExistsError) as err:
            print(err, file=sys.stderr)
            return status or 1
    return status


if __name__ == "__main__":
    sys.exit(main())
