"""Every ```python block of README.md and docs/**/*.md runs, so the documentation cannot rot (issue 28).

Blocks are grouped by the framework they import (torch; Keras 3 or TensorFlow; tf_keras, which needs
``TF_USE_LEGACY_KERAS=1`` before TensorFlow's import) and each group runs in one job: at 2 ranks under mpirun where a
block of it calls ``init()``, else as one process. Inside a job each block runs in its own globals; a failure names
the block's file and line. A block that is not meant to run (a shell command line) uses another fence language.
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from mpi_harness import WORKERS, launch, mpi_env, mpirun

ROOT = Path(__file__).resolve().parent.parent
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^\s*```(?P<lang>[\w+-]*)\s*$")
KERAS_IMPORT = re.compile(r"^\s*(import|from)\s+(keras|tensorflow|tf_keras|hvd_compress\.(keras|tensorflow))\b", re.M)


@dataclass(frozen=True)
class Block:
    file: str  # relative to the repository root
    line: int  # the line of the opening fence (1-based); the code starts on the next one
    code: str

    @property
    def flavour(self) -> str:
        if "TF_USE_LEGACY_KERAS" in self.code:
            return "tf_keras"
        return "keras" if KERAS_IMPORT.search(self.code) else "torch"

    @property
    def needs_mpi(self) -> bool:
        return "init(" in self.code


def python_blocks(path: Path) -> list[Block]:
    """The ```python blocks of one Markdown file, dedented (a block may sit in a list item)."""
    blocks, lines = [], path.read_text().split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, lang = i, m["lang"]
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            i += 1
        assert i < len(lines), f"{path.relative_to(ROOT)}:{start + 1}: code fence never closed"
        if lang == "python":
            code = textwrap.dedent("\n".join(lines[start + 1 : i]))
            assert not code.startswith(" "), f"{path.relative_to(ROOT)}:{start + 1}: block indented unevenly"
            blocks.append(Block(str(path.relative_to(ROOT)), start + 1, code + "\n"))
        i += 1
    return blocks


BLOCKS = [b for path in DOC_FILES for b in python_blocks(path)]
FLAVOURS = sorted({b.flavour for b in BLOCKS})


def test_the_docs_have_python_blocks_in_readme_and_docs() -> None:
    files = {b.file for b in BLOCKS}
    assert "README.md" in files, "README.md has no ```python block"
    assert any(f.startswith("docs/") for f in files), "docs/ has no ```python block"


@pytest.mark.parametrize("block", BLOCKS, ids=[f"{b.file}:{b.line}" for b in BLOCKS])
def test_doc_block_compiles(block: Block) -> None:
    compile("\n" * block.line + block.code, block.file, "exec")


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_doc_blocks_run(flavour: str, out_dir: Path) -> None:
    """Every block of this flavour runs to the end; at 2 ranks where a block calls ``init()``."""
    blocks = [b for b in BLOCKS if b.flavour == flavour]
    listing = out_dir / "blocks.json"
    listing.write_text(json.dumps([{"file": b.file, "line": b.line, "code": b.code} for b in blocks]))
    env = {"TF_USE_LEGACY_KERAS": "1"} if flavour == "tf_keras" else {}
    where = ", ".join(f"{b.file}:{b.line}" for b in blocks)
    if any(b.needs_mpi for b in blocks):
        res = mpirun("doc_blocks.py", 2, out_dir, str(listing), timeout=300, env=env, check=False)
    else:
        res = launch([sys.executable, str(WORKERS / "doc_blocks.py"), str(out_dir), str(listing)], 300, mpi_env(env))
    failed = re.findall(r"doc block failed: \S+", res.stdout)
    why = failed or f"exit {res.returncode}"
    assert res.returncode == 0, f"{flavour} blocks ({where}): {why}\n{res.stdout[-6000:]}"
    # Two ranks share stdout, so one rank's line may run into the other's: match each file:line alone.
    ran = set(re.findall(r"doc block ran: (\S+?:\d+)", res.stdout))
    missing = [f"{b.file}:{b.line}" for b in blocks if f"{b.file}:{b.line}" not in ran]
    assert not missing, f"{flavour}: these blocks never reported running: {missing}\n{res.stdout[-6000:]}"


LINK = re.compile(r"\]\((?!https?://)(?P<target>[^)#\s]*)(?:#(?P<anchor>[^)\s]*))?\)")


def anchors(path: Path) -> set[str]:
    """GitHub's anchors of a Markdown file's headings (lower case, punctuation dropped, spaces as dashes) and its
    ``<a id="...">`` anchors. A line inside a code fence (a shell or Python comment) is no heading."""
    out, fenced = set(), False
    for line in path.read_text().split("\n"):
        if FENCE.match(line):
            fenced = not fenced
        elif line.startswith("#") and not fenced:
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
        if not fenced:  # an explicit anchor, as the generated pages put before a table or a run's stamp
            out.update(re.findall(r'<a id="([^"]+)"></a>', line))
    return out


@pytest.mark.parametrize("path", DOC_FILES, ids=[str(p.relative_to(ROOT)) for p in DOC_FILES])
def test_doc_links_point_at_files_and_headings_that_exist(path: Path) -> None:
    broken = []
    for m in LINK.finditer(path.read_text()):
        target = (path.parent / m["target"]).resolve() if m["target"] else path
        if not target.exists():
            broken.append(m.group(0))
        elif m["anchor"] and target.suffix == ".md" and m["anchor"] not in anchors(target):
            broken.append(m.group(0))
    assert not broken, f"{path.relative_to(ROOT)}: broken links {broken}"
