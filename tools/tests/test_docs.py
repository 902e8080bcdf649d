"""The documentation points at things that exist: every relative link and every repository
path a Markdown file names resolves (headings included, for `#anchor` links), no tracked
file names a `../` path that is not in the repository, and the README's layout names
every pack committed under kernels/. Run in CI with the other tools tests."""

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Top-level entries whose paths the documentation names (build*/ outputs are not tracked).
TOP = ("include", "src", "tests", "tools", "bench", "docs", "kernels", "cmake", "examples")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_CODE = re.compile(r"`([^`\n]+)`")
_PATH = re.compile(r"(?:\.\./)*[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.$-]+)+/?")
# Paths named by a contract written ahead of its code (docs/llama.md: the Llama engine's
# kernels, pack and example): accepted while they do not exist yet, checked like any
# other once they do.
AHEAD = ("kernels/llama/", "kernels/llamapack/", "examples/llama/")


def _tracked(pattern: str):
    out = subprocess.run(["git", "ls-files", pattern], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout.split()
    return [REPO / p for p in out]


MARKDOWN = _tracked("*.md")


def _anchors(path: Path):
    """GitHub's anchors of a Markdown file's headings."""
    anchors = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        m = re.match(r"#+\s+(.*)", line)
        if m:
            text = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower().replace("`", ""))
            anchors.add(text.replace(" ", "-"))
    return anchors


def _resolves(doc: Path, target: str) -> bool:
    """Whether a path a document names exists: relative to the document, or (a path that
    starts at a top-level directory) to the repository root."""
    target = target.rstrip("/")
    if (doc.parent / target).exists():
        return True
    return target.split("/")[0] in TOP and (REPO / target).exists()


def test_the_markdown_files_are_found():
    names = {str(p.relative_to(REPO)) for p in MARKDOWN}
    assert {"README.md", "docs/pack-format.md", "bench/README.md", "tools/README.md"} <= names


@pytest.mark.parametrize("doc", MARKDOWN, ids=[str(p.relative_to(REPO)) for p in MARKDOWN])
def test_links_and_named_paths_resolve(doc):
    text = doc.read_text(encoding="utf-8")
    broken = []
    for target in _LINK.findall(_CODE.sub("", text)):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = doc if not path else doc.parent / path
        if not file.exists():
            broken.append(f"link {target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in _anchors(file):
            broken.append(f"link {target}: no heading #{anchor}")
    for code in _CODE.findall(text):
        for token in code.split():
            if not _PATH.fullmatch(token) or "{" in token or "<" in token or "*" in token:
                continue
            starts_here = token.startswith("../") or token.split("/")[0] in TOP
            ahead = doc.name == "llama.md" and (token + "/").startswith(AHEAD)
            if starts_here and not ahead and not _resolves(doc, token):
                broken.append(f"path `{token}` does not exist")
    assert broken == [], f"{doc.relative_to(REPO)}: " + "; ".join(broken)


def test_no_tracked_file_names_a_path_that_is_not_there():
    """A relative path with `..` must name a file of the repository, relative to the file
    that names it or to the repository root: a reader of a clone has nothing else
    (docs/pack-format.md linked a note its writers kept beside the repository)."""
    dangling = []
    for pattern in ("*.md", "*.py", "*.cc", "*.h", "*.sh", "*.txt", "*.cmake", "*.toml"):
        for path in _tracked(pattern):
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                # Not an ellipsis (`.../lib.so`) nor a string literal (a test's own
                # `"../outside.cubin"`): a path the text tells the reader about.
                for token in re.findall(r"(?<![.\w\"'])(?:\.\./)+[A-Za-z0-9_][A-Za-z0-9_./-]*"
                                        r"[A-Za-z0-9_/]", line):
                    inside = [(base / token).resolve() for base in (path.parent, REPO)]
                    if not any(t.is_relative_to(REPO) and t.exists() for t in inside):
                        dangling.append(f"{path.relative_to(REPO)}:{n}: {token}")
    assert dangling == []


def _layout_block():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```text\n", 1)[1].split("```", 1)[0]


def test_the_readme_layout_names_every_committed_pack():
    packs = sorted(p.parent.name for p in _tracked("kernels/*/manifest.json"))
    assert "testpack" in packs and "examplepack" in packs
    layout = _layout_block()
    missing = [p for p in packs if not re.search(rf"\b{re.escape(p)}\b", layout)]
    assert missing == [], f"README.md's layout does not name {missing}"
