"""The documentation is self-contained: every file it points to is in the repository.

Checked documents: README.md, docs/*.md, examples/**/README.md and benchmarks/*.md.
References are markdown links ``[text](path)`` (resolved from the document's directory;
web links and anchors are skipped) and backticked paths that look like repository
paths: a path whose first part is an entry of the repository root (``docs/env.md``,
``fleet/kernels/``, ``.ci/run``), or a name ending in a source extension (``train.py``,
resolved from the document's directory, then from the root). A glob (``tests/unit/test_*.py``)
must match something; a path with a placeholder (``<table>@ids``) is not a path. A
backticked path that is missing is allowed only when ``.gitignore`` declares it a
generated output (``examples/ctr_dnn/data/``).

No file under README.md, docs/, examples/, benchmarks/ or fleet/ cites ``DESIGN.md`` or
``shared/``: those are outside the repository.
"""
import glob
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCE_EXTENSIONS = (".py", ".md", ".sh", ".toml", ".cfg", ".ini", ".yaml", ".yml")
CITATION_SCANNED = ("README.md", "docs", "examples", "benchmarks", "fleet")
FORBIDDEN_CITATIONS = re.compile(r"DESIGN\.md|(?<![\w.-])shared/")
_LINK = re.compile(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_CODE = re.compile(r"`([^`\n]+)`")
_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
_PATHLIKE = re.compile(r"[\w.\-/*@]+")


def documents(root=ROOT):
    """The checked markdown files, as paths relative to ``root``."""
    found = ["README.md"] + sorted(glob.glob("docs/*.md", root_dir=root))
    found += sorted(glob.glob("examples/**/README.md", root_dir=root, recursive=True))
    found += sorted(glob.glob("benchmarks/*.md", root_dir=root))
    return [f for f in found if (root / f).is_file()]


def root_entries(root=ROOT):
    """Names at the repository root a path may start with (not the VCS or caches)."""
    return {n for n in os.listdir(root) if n not in (".git", ".pytest_cache", "__pycache__")}


def generated_outputs(root=ROOT):
    """Path prefixes ``.gitignore`` declares generated (no globs), without trailing '/'."""
    path = root / ".gitignore"
    if not path.is_file():
        return set()
    out = set()
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "!")) and "*" not in line and "/" in line.rstrip("/"):
            out.add(line.strip("/"))
    return out


def _exists(root, base, ref):
    for start in (base, root):
        candidate = os.path.normpath(os.path.join(start, ref))
        if not candidate.startswith(str(root)):
            continue
        if ("*" in ref and glob.glob(candidate)) or os.path.exists(candidate):
            return True
    return False


def looks_like_repo_path(token, entries):
    """True when a backticked ``token`` is meant as a path in the repository."""
    if not _PATHLIKE.fullmatch(token) or token.startswith(("/", "~")) or token.strip("/.") == "":
        return False
    first = token.split("/", 1)[0]
    return ("/" in token and first in entries) or token.endswith(SOURCE_EXTENSIONS)


def broken_references(text, doc, root=ROOT):
    """The references of markdown ``text`` (the document ``doc``, relative to ``root``)
    that point to nothing in the repository.

    Returns:
        A list of (kind, reference) with kind "link" or "path".
    """
    root = Path(root)
    base = str((root / doc).parent)
    broken = []
    for ref in _LINK.findall(text):
        if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", ref) or ref.startswith("#"):
            continue
        path = ref.split("#", 1)[0]
        if path and not os.path.exists(os.path.normpath(os.path.join(base, path))):
            broken.append(("link", ref))
    entries = root_entries(root)
    generated = generated_outputs(root)
    for token in _CODE.findall(_FENCE.sub("", text)):
        token = token.strip()
        if not looks_like_repo_path(token, entries) or _exists(root, base, token):
            continue
        if any(token.rstrip("/") == g or token.startswith(g + "/") for g in generated):
            continue
        broken.append(("path", token))
    return broken


def forbidden_citations(text):
    """The citations of files outside the repository (``DESIGN.md``, ``shared/``) in ``text``."""
    return FORBIDDEN_CITATIONS.findall(text)


def _scanned_files(root=ROOT):
    for top in CITATION_SCANNED:
        path = root / top
        if path.is_file():
            yield path
            continue
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames[:] = [d for d in dirnames if d != "__pycache__" and not (Path(dirpath) / d).is_symlink()]
            for name in filenames:
                yield Path(dirpath) / name


# ------------------------------------------------------------------ the checker itself
def test_the_checker_finds_a_missing_link_and_missing_backticked_paths(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "fleet").mkdir()
    (tmp_path / "docs" / "env.md").write_text("x")
    (tmp_path / ".gitignore").write_text("# outputs\nexamples/out/\n*.pyc\n")
    text = ("See [the env](env.md), [a missing page](missing.md#part), [the web](https://example.com) "
            "and [here](#top). Read `docs/env.md`, `fleet/kernels/nope.py`, `nowhere.py`, "
            "`docs/*.md`, `fleet/*.rs`, `<table>@ids`, `log/serverlog.N` and `examples/out/a.txt`.\n"
            "```\n`fleet/in_a_fence.py`\n```\n")
    assert broken_references(text, "docs/page.md", tmp_path) == [
        ("link", "missing.md#part"), ("path", "fleet/kernels/nope.py"), ("path", "nowhere.py"),
        ("path", "fleet/*.rs")]


def test_the_checker_finds_citations_of_files_outside_the_repository():
    text = "as DESIGN.md says; see shared/notes.md; a shared/ folder. Not unshared/ nor preshared/x."
    assert forbidden_citations(text) == ["DESIGN.md", "shared/", "shared/"]


def test_the_checker_reads_the_documents_it_promises():
    docs = documents()
    assert "README.md" in docs and "docs/internals.md" in docs and "examples/ctr_dnn/README.md" in docs
    assert "benchmarks/RESULTS.md" in docs


# ------------------------------------------------------------------ the repository
@pytest.mark.parametrize("doc", documents())
def test_every_file_a_document_refers_to_exists(doc):
    broken = broken_references((ROOT / doc).read_text(), doc)
    assert not broken, f"{doc} refers to files that are not in the repository: {broken}"


def test_no_file_cites_design_md_or_shared():
    citing = {}
    for path in _scanned_files():
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue  # binary files cite nothing
        found = forbidden_citations(text)
        if found:
            citing[str(path.relative_to(ROOT))] = sorted(set(found))
    assert not citing, f"these files cite files outside the repository: {citing}"
