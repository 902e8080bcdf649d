"""The installed package: its files, the C++ build flags it reports, the console scripts."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import kpack
from kpack import _tools_entry

from conftest import KERNELS


def test_build_flags_point_at_the_installed_library_and_headers():
    flags = kpack.build_flags()
    assert set(flags) == {"include_dirs", "extra_compile_args", "extra_link_args"}
    assert Path(flags["include_dirs"][0], "kpack", "runtime.h").is_file()
    assert Path(flags["include_dirs"][0], "kpack", "torch.h").is_file()
    assert any(Path(d, "absl", "status", "status.h").is_file() for d in flags["include_dirs"])
    assert any(Path(d, "cuda.h").is_file() for d in flags["include_dirs"])
    assert flags["extra_compile_args"] == ["-std=c++20"]
    library = flags["extra_link_args"][0]
    assert Path(library).is_file() and Path(library).parent == \
        Path(kpack.__file__).parent / "lib"


def test_extension_does_not_import_torch_or_triton():
    r = subprocess.run([sys.executable, "-c",
                        "import sys, kpack; print('torch' in sys.modules, "
                        "'triton' in sys.modules)"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.split() == ["False", "False"], r.stderr


def test_kpack_tools_ship_with_their_bootstrap():
    import kpack_tools  # noqa: PLC0415
    boot = Path(kpack_tools.__file__).parent / "_record_boot" / "sitecustomize.py"
    assert boot.is_file()


def _script(name: str) -> str:
    path = shutil.which(name, path=os.path.dirname(sys.executable))
    assert path, f"console script {name} is not installed next to {sys.executable}"
    return path


@pytest.mark.parametrize("name", ["kpack-build", "kpack-record"])
def test_console_scripts_run(name):
    r = subprocess.run([_script(name), "--help"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "--out" in r.stdout
    # The usage names the command the user typed, not `python -m kpack_tools...`.
    assert r.stdout.startswith(f"usage: {name} "), r.stdout


def test_console_scripts_refuse_a_missing_or_wrong_triton(monkeypatch, capsys):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)
    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert _tools_entry.build() == 1
    assert "Triton is not installed" in capsys.readouterr().err
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "3.5.1")
    assert _tools_entry.record() == 1
    err = capsys.readouterr().err
    assert "Triton 3.5.1 is installed" in err and "pip install 'kpack[tools]'" in err


def test_build_flags_build_a_cpp_program_that_opens_a_pack(tmp_path, driver):
    # What a torch extension gets from kpack.build_flags(), minus torch: compile, link and
    # run a C++ program against the installed headers and libkpack.
    cxx = shutil.which("c++") or shutil.which("g++")
    assert cxx, "no C++ compiler"
    (tmp_path / "main.cc").write_text(r'''
#include <kpack/kpack.h>
#include <cstdio>
int main(int argc, char** argv) {
  kpack::Options options;
  options.driver_path = argv[2];
  absl::StatusOr<kpack::Runtime> rt = kpack::Runtime::Open(argv[1], options);
  if (!rt.ok()) { std::printf("%s\n", std::string(rt.status().message()).c_str()); return 1; }
  for (const std::string& name : rt->kernel_names()) std::printf("%s\n", name.c_str());
  return 0;
}
''')
    flags = kpack.build_flags()
    cmd = [cxx, *flags["extra_compile_args"], *(f"-I{d}" for d in flags["include_dirs"]),
           str(tmp_path / "main.cc"), "-o", str(tmp_path / "main"), *flags["extra_link_args"]]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, " ".join(cmd) + "\n" + r.stderr[-3000:]
    r = subprocess.run([str(tmp_path / "main"), str(KERNELS / "testpack"), driver],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "scalars" in r.stdout.split(), r.stdout + r.stderr


def test_the_extension_uses_only_kpacks_public_api():
    # No back doors: src/python includes kpack's public headers (include/kpack), its own
    # files, and third-party ones, never the library's internals under src/.
    src = Path(__file__).resolve().parents[2] / "src" / "python"
    own = {p.name for p in src.glob("*.h")}
    for source in sorted(src.glob("*.[ch]*")):
        for line in source.read_text().splitlines():
            if line.startswith('#include "'):
                header = line.split('"')[1]
                assert header in own or header.startswith(("kpack/", "absl/")), \
                    f"{source.name} includes {header}"


def test_the_extension_calls_no_library_internals():
    # The library loads the CUDA driver once (kpack::Runtime); the extension reaches it, and
    # everything else of the library, only through the public API: no kpack::internal
    # symbol (such as Driver::Load, which would dlopen the driver a second time).
    nm = shutil.which("nm")
    assert nm, "nm (binutils) is needed to read the extension's symbols"
    extension = next(Path(kpack.__file__).parent.glob("_kpack*.so"))
    r = subprocess.run([nm, "-D", "--undefined-only", str(extension)], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    undefined = [line.split()[-1] for line in r.stdout.splitlines()]
    assert any(name.startswith("_ZNK5kpack7Runtime") for name in undefined), "nm worked"
    internal = [name for name in undefined if name.startswith(("_ZN5kpack8internal",
                                                               "_ZNK5kpack8internal"))]
    assert not internal, internal
    assert not {"dlopen", "dlsym"} & {name.split("@")[0] for name in undefined}


def test_test_only_code_is_not_in_the_package():
    from kpack import _kpack  # noqa: PLC0415
    assert not hasattr(_kpack, "_testing")
    package = Path(kpack.__file__).parent
    assert not [p for p in package.rglob("*") if "testing" in p.name], "test code in the wheel"
