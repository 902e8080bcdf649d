#!/usr/bin/env python3
"""Checks that the code shown in the docs is the code CI compiles.

Every fenced C++ or CMake block of README.md, and every example in the public headers
(include/kpack/*.h: a run of comment lines indented by at least three spaces, `//   `),
must appear verbatim in a file under examples/, which CI builds against the installed
package with gcc and clang (ctest kpack_examples_build_*). Verbatim means the same lines
in the same order, each compared without its leading and trailing whitespace (so a block
may sit indented in a function); a line `...` in a block skips any number of lines.

A list item's wrapped lines (a run right after a `//  - ` or `// - ` bullet line, with no
bare `//` line between) are prose, not an example.

A block that is not meant to compile says so:
  README.md: the line just before its fence is `<!-- not compiled: REASON -->`;
  a header:  the comment line just before it (a bare `//` line in between is allowed)
             contains `not compiled`.
Every fence in README.md must name its language (```sh, ```cpp, ```cmake, ...), so that
C++ cannot slip past this check in an unlabelled block.

Usage: python3 tools/check_doc_examples.py [--root DIR]     (exit 0: all present)
Stdlib only: it runs in the CPU tier (ctest kpack_doc_examples) wherever python3 does.
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import re
import sys

CHECKED_LANGUAGES = {"cpp", "c++", "cc", "cxx", "cmake"}
EXAMPLE_SUFFIXES = {".cc", ".cpp", ".h", ".hpp", ".cmake", ".txt"}
README_SKIP = re.compile(r"^\s*<!--\s*not compiled:.*-->\s*$")
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([^\s`]*)")


@dataclasses.dataclass
class Block:
    where: str  # "README.md:12"
    kind: str  # "```cpp block", "header example"
    lines: list[str]  # the code, one entry per line, as written


def readme_blocks(path: pathlib.Path, rel: str) -> tuple[list[Block], list[str], int]:
    """The README's checked blocks, its errors, and how many blocks are marked skipped."""
    blocks, errors, skipped = [], [], 0
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, lang, start = m.group(2), m.group(3).lower(), i
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        if end == len(lines):
            errors.append(f"{rel}:{start + 1}: a code fence that is never closed")
            break
        body = lines[start + 1:end]
        i = end + 1
        if not lang:
            errors.append(f"{rel}:{start + 1}: a code block without a language: label it "
                          "(```sh, ```cpp, ```cmake, ```text, ...)")
            continue
        if lang not in CHECKED_LANGUAGES:
            continue
        if start > 0 and README_SKIP.match(lines[start - 1]):
            skipped += 1
            continue
        blocks.append(Block(f"{rel}:{start + 2}", f"```{lang} block", body))
    return blocks, errors, skipped


def header_blocks(path: pathlib.Path, rel: str) -> tuple[list[Block], int]:
    """A header's `//   ` examples, and how many are marked not compiled."""
    blocks, skipped = [], 0
    lines = path.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].lstrip().startswith("//   "):
            i += 1
            continue
        start = i
        while i < len(lines) and lines[i].lstrip().startswith("//   "):
            i += 1
        before = start - 1
        if before >= 0 and re.match(r"//\s{1,2}- ", lines[before].lstrip()):
            continue  # the wrapped lines of a list item
        if before >= 0 and lines[before].strip() == "//":
            before -= 1
        if before >= 0 and "not compiled" in lines[before]:
            skipped += 1
            continue
        body = [line.lstrip()[2:] for line in lines[start:i]]
        blocks.append(Block(f"{rel}:{start + 1}", "header example", body))
    return blocks, skipped


def fragments(block: Block) -> list[list[str]]:
    """The block's lines, stripped, split at `...` lines; leading/trailing blanks dropped."""
    out, cur = [], []
    for line in block.lines:
        s = line.strip()
        if s == "...":
            out.append(cur)
            cur = []
        else:
            cur.append(s)
    out.append(cur)
    trimmed = []
    for frag in out:
        while frag and not frag[0]:
            frag = frag[1:]
        while frag and not frag[-1]:
            frag = frag[:-1]
        if frag:
            trimmed.append(frag)
    return trimmed


def find_in(frags: list[list[str]], text: list[str]) -> bool:
    pos = 0
    for frag in frags:
        n = len(frag)
        while pos + n <= len(text) and text[pos:pos + n] != frag:
            pos += 1
        if pos + n > len(text):
            return False
        pos += n
    return True


def closest(frag: list[str], files: dict[str, list[str]]) -> str:
    """Where the block's first fragment matches longest, and its first differing line."""
    best = (0, "", 0)
    for name, text in files.items():
        for p in range(len(text)):
            k = 0
            while k < len(frag) and p + k < len(text) and text[p + k] == frag[k]:
                k += 1
            if k > best[0]:
                best = (k, name, p)
    k, name, p = best
    if k == 0:
        return f"no line of it is in examples/ (first line: {frag[0]!r})"
    if k == len(frag):
        return (f"its first part is at {name}:{p + 1}, but a later part (after a `...`) is "
                "not after it")
    found = files[name][p + k] if p + k < len(files[name]) else "<end of file>"
    return (f"closest: {name}:{p + 1}, which differs at block line {k + 1}: expected "
            f"{frag[k]!r}, found {found!r}")


def check(root: pathlib.Path) -> tuple[list[str], int, int]:
    errors: list[str] = []
    blocks, readme_errors, skipped = readme_blocks(root / "README.md", "README.md")
    errors += readme_errors
    for header in sorted((root / "include" / "kpack").glob("*.h")):
        hb, hs = header_blocks(header, str(header.relative_to(root)))
        blocks += hb
        skipped += hs
    files = {}
    for f in sorted((root / "examples").rglob("*")):
        if f.is_file() and f.suffix in EXAMPLE_SUFFIXES:
            files[str(f.relative_to(root))] = [
                line.strip() for line in f.read_text(encoding="utf-8").splitlines()]
    if not files:
        errors.append("examples/: no example sources")
    for block in blocks:
        frags = fragments(block)
        if not frags:
            continue
        if not any(find_in(frags, text) for text in files.values()):
            errors.append(f"{block.where}: this {block.kind} is not in examples/ verbatim; "
                          f"{closest(frags[0], files)} (mark it as not compiled if it is not "
                          "meant to compile)")
    return errors, len(blocks), skipped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", type=pathlib.Path,
                        default=pathlib.Path(__file__).resolve().parent.parent)
    args = parser.parse_args(argv)
    errors, checked, skipped = check(args.root)
    for e in errors:
        print(e, file=sys.stderr)
    print(f"{checked} C++/CMake blocks of README.md and include/kpack/*.h checked against "
          f"examples/, {skipped} marked not compiled: {len(errors)} problems")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
