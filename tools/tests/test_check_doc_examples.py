"""tools/check_doc_examples.py: README/header code must be in examples/ verbatim."""

import pathlib
import subprocess
import sys
import textwrap

import pytest

TOOLS = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TOOLS))
import check_doc_examples  # noqa: E402

ROOT = TOOLS.parent

EXAMPLE = textwrap.dedent("""\
    #include <kpack/kpack.h>

    absl::Status F(int n) {
      const kpack::Grid grid{static_cast<uint32_t>(n)};
      return absl::OkStatus();
    }
    """)


def make_tree(tmp_path, readme, header="", example=EXAMPLE):
    (tmp_path / "include" / "kpack").mkdir(parents=True)
    (tmp_path / "examples").mkdir()
    (tmp_path / "README.md").write_text(readme)
    (tmp_path / "include" / "kpack" / "runtime.h").write_text(header)
    (tmp_path / "examples" / "f.cc").write_text(example)
    return check_doc_examples.check(tmp_path)


def test_the_repository_passes():
    result = subprocess.run([sys.executable, str(TOOLS / "check_doc_examples.py")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "0 problems" in result.stdout


def test_a_block_present_verbatim_passes_even_reindented(tmp_path):
    readme = "```cpp\n  const kpack::Grid grid{static_cast<uint32_t>(n)};\n  return absl::OkStatus();\n```\n"
    errors, checked, _ = make_tree(tmp_path, readme)
    assert (errors, checked) == ([], 1)


def test_a_drifted_block_fails_and_says_where(tmp_path):
    # The README's old example: narrowing, which clang refuses.
    readme = "x\n```cpp\nconst kpack::Grid grid{(n + 1023) / 1024};\n```\n"
    errors, _, _ = make_tree(tmp_path, readme)
    assert len(errors) == 1
    assert errors[0].startswith("README.md:3: this ```cpp block is not in examples/ verbatim")


def test_closest_match_names_the_first_differing_line(tmp_path):
    readme = "```cpp\n#include <kpack/kpack.h>\n\nabsl::Status F(long n) {\n```\n"
    errors, _, _ = make_tree(tmp_path, readme)
    assert len(errors) == 1
    assert "closest: examples/f.cc:1, which differs at block line 3" in errors[0]
    assert "'absl::Status F(long n) {'" in errors[0]


def test_cmake_blocks_are_checked_and_sh_blocks_are_not(tmp_path):
    readme = "```cmake\nfind_package(kpack REQUIRED)\n```\n```sh\nanything at all\n```\n"
    errors, checked, _ = make_tree(tmp_path, readme)
    assert checked == 1 and len(errors) == 1 and "```cmake block" in errors[0]


def test_unlabelled_fence_fails(tmp_path):
    errors, _, _ = make_tree(tmp_path, "```\nint x = 1;\n```\n")
    assert errors == ["README.md:1: a code block without a language: label it "
                      "(```sh, ```cpp, ```cmake, ```text, ...)"]


def test_marked_not_compiled_is_skipped(tmp_path):
    readme = "<!-- not compiled: pseudo-code -->\n```cpp\nfoo(bar);\n```\n"
    errors, checked, skipped = make_tree(tmp_path, readme)
    assert (errors, checked, skipped) == ([], 0, 1)


def test_header_examples_with_elision_must_keep_their_order(tmp_path):
    header = ("// Example:\n//\n//   #include <kpack/kpack.h>\n//   ...\n"
              "//   return absl::OkStatus();\n")
    errors, checked, _ = make_tree(tmp_path, "", header)
    assert (errors, checked) == ([], 1)
    swapped = ("//   return absl::OkStatus();\n//   ...\n//   #include <kpack/kpack.h>\n")
    errors, _, _ = make_tree(tmp_path / "b", "", swapped)
    assert len(errors) == 1 and "include/kpack/runtime.h:1: this header example" in errors[0]


def test_header_table_marked_not_compiled_is_skipped(tmp_path):
    header = "// Types (a table, not compiled):\n//\n//   int -> i32\n"
    errors, checked, skipped = make_tree(tmp_path, "", header)
    assert (errors, checked, skipped) == ([], 0, 1)


@pytest.mark.parametrize("old", ["README.md", "include/kpack/runtime.h"])
def test_the_pre_examples_docs_fail(tmp_path, old):
    # The README and header example before examples/ existed (af67435): both drifted.
    text = subprocess.run(["git", "-C", str(ROOT), "show", f"af67435:{old}"],
                          capture_output=True, text=True)
    if text.returncode != 0:
        pytest.skip("no git history here (af67435)")
    readme = text.stdout if old == "README.md" else ""
    header = text.stdout if old != "README.md" else ""
    (tmp_path / "include" / "kpack").mkdir(parents=True)
    (tmp_path / "README.md").write_text(readme)
    (tmp_path / "include" / "kpack" / "runtime.h").write_text(header)
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    errors, _, _ = check_doc_examples.check(tmp_path)
    assert errors


def test_wrapped_list_items_are_prose_but_an_example_after_a_list_is_checked(tmp_path):
    header = ("// Scratch comes from:\n//  - a ScratchAllocator the caller passes, or\n"
              "//    else the one in Options;\n// - a stream's arena,\n//   per stream.\n")
    errors, checked, _ = make_tree(tmp_path, "", header)
    assert (errors, checked) == ([], 0)
    code_after_list = header + "//\n//   kpack::Grid grid{1};\n"
    errors, checked, _ = make_tree(tmp_path / "b", "", code_after_list)
    assert checked == 1 and len(errors) == 1 and "runtime.h:7" in errors[0]
