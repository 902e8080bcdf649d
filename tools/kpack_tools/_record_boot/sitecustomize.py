"""Bootstrap of ``python -m kpack_tools.record``: installs the recorder in
every Python process of the recorded program.

The command line puts this directory first on ``PYTHONPATH``, so Python's
``site`` imports this file at start-up in the program and in any Python
subprocess it starts.  It removes itself from ``sys.path`` and runs the
``sitecustomize`` it shadowed, if there is one.  A process without Triton is
left alone; a process with an unsupported Triton version is stopped (exit
status 2) before the program runs, with the reason on stderr and in the
recording directory, so nothing is recorded from a version the recorder does
not understand.  Any other failure of the recorder is reported the same way
(the program still runs, and the command line writes no pack).
"""

import atexit
import importlib
import os
import sys
import traceback

_HERE = os.path.dirname(os.path.abspath(__file__))


def _report(dump_dir: str, text: str) -> None:
    with open(os.path.join(dump_dir, f"{os.getpid()}.error"), "w", encoding="utf-8") as f:
        f.write(text + "\n")


def _boot() -> None:
    dump_dir = os.environ.get("KPACK_RECORD_DIR")
    tools = os.environ.get("KPACK_RECORD_TOOLS")
    if not dump_dir or not tools or not os.path.isdir(dump_dir):
        return
    try:
        import triton
    except ImportError:
        return  # no Triton in this interpreter: it compiles nothing to record
    sys.path.insert(0, tools)
    try:
        from kpack_tools import record
    finally:
        sys.path.remove(tools)
    try:
        record.check_triton_version(triton.__version__)
    except record.UnsupportedTritonVersion as err:
        _report(dump_dir, str(err))
        sys.stderr.write(f"{err}\n")
        sys.stderr.flush()
        os._exit(2)
    try:
        recorder = record.Recorder(
            dump_dir=dump_dir, log=None,
            max_launches=int(os.environ.get("KPACK_RECORD_MAX_LAUNCHES",
                                            record.DEFAULT_MAX_LAUNCHES)))
        recorder.start()
        atexit.register(recorder.stop)
    except Exception:  # noqa: BLE001 - reported to the command line, which writes no pack
        _report(dump_dir, "kpack record: the recorder failed to start in process "
                          f"{os.getpid()}:\n{traceback.format_exc()}")


def _chain() -> None:
    """Run the sitecustomize this file shadows (e.g. a distribution's)."""
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    # Importing runs the other file; this module goes back into sys.modules
    # afterwards because the import machinery that is loading it expects it there.
    this = sys.modules.pop("sitecustomize")
    try:
        importlib.import_module("sitecustomize")
    except ModuleNotFoundError as err:
        if err.name != "sitecustomize":
            raise
    finally:
        sys.modules["sitecustomize"] = this


_chain()
_boot()
