"""Rebuild the two DOCX documents of the evaluation set from their plain-text originals.

Provenance only: the .docx files in eval/documents/ are committed, and this script is kept
so that the conversion can be reviewed and repeated. It reads the Debian-installed originals:

  /usr/share/common-licenses/MPL-2.0          -> eval/documents/mpl-2.0.docx
  /usr/share/doc/systemd/UIDS-GIDS.md.gz      -> eval/documents/systemd-uids-gids.docx

The text is the originals' text; only the layout changes: hard-wrapped lines are joined into
one paragraph, section titles become Heading 1/Heading 2 paragraphs, Markdown inline markup
(backticks, links, emphasis) is removed, and the Markdown table becomes a Word table.

Usage: .venv/bin/python eval/tools/make_docx.py [MPL-2.0 path] [UIDS-GIDS.md(.gz) path] [output dir]
(output dir defaults to eval/documents/; rebuilding gives the same text but different zip bytes)
"""

from __future__ import annotations

import datetime as _dt
import gzip
import re
import sys
from pathlib import Path

import docx
from docx.shared import Pt

OUT = Path(__file__).resolve().parent.parent / "documents"
FIXED_DATE = _dt.datetime(2024, 1, 1, tzinfo=_dt.UTC)


def _collapse(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def _new_document(title: str, author: str, comments: str) -> docx.Document:
    d = docx.Document()
    cp = d.core_properties
    cp.title = title
    cp.author = author
    cp.comments = comments
    cp.created = FIXED_DATE
    cp.modified = FIXED_DATE
    cp.last_modified_by = author
    cp.revision = 1
    return d


# --------------------------------------------------------------------------- MPL-2.0


def _mpl_blocks(raw: str) -> list[list[str]]:
    lines = []
    for line in raw.splitlines():
        if re.fullmatch(r"\*+", line.strip()):
            lines.append("")  # top/bottom border of the boxed sections 6 and 7
            continue
        m = re.fullmatch(r"\*(.*)\*", line.rstrip())
        if m:
            lines.append(m.group(1).rstrip())
            continue
        lines.append(line.rstrip())
    blocks: list[list[str]] = []
    cur: list[str] = []
    for line in lines:
        if line.strip():
            cur.append(line.strip())
        elif cur:
            blocks.append(cur)
            cur = []
    if cur:
        blocks.append(cur)
    return blocks


def build_mpl(src: Path, dst: Path) -> None:
    d = _new_document(
        "Mozilla Public License Version 2.0",
        "Mozilla Foundation",
        "Converted to DOCX from the plain-text MPL-2.0 (Debian base-files, "
        "/usr/share/common-licenses/MPL-2.0); text unchanged, layout only.",
    )
    section = 0
    for block in _mpl_blocks(src.read_text(encoding="utf-8")):
        if len(block) == 2 and set(block[1]) == {"="}:
            d.add_heading(block[0], level=0)
            continue
        if len(block) == 2 and set(block[1]) == {"-"}:
            d.add_heading(block[0], level=1)
            m = re.match(r"(\d+)\.", block[0])
            section = int(m.group(1)) if m else 99
            continue
        text = _collapse(" ".join(block))
        numbered = re.match(r"\d+\.\d+\. ", text)
        if section == 1 and numbered:
            # A definition: the term and its "means ..." text form one paragraph.
            d.add_paragraph(text)
            continue
        if section >= 2 and numbered and not re.search(r"[.;:]$", text) and len(text) < 100:
            d.add_heading(text, level=2)
            continue
        d.add_paragraph(text)
    d.save(dst)


# --------------------------------------------------------------------------- systemd UIDS-GIDS.md


def _md_inline(text: str) -> str:
    text = re.sub(r"\[([^\]]+)\]\([^)]+\)", r"\1", text)  # links -> their text
    text = text.replace("`", "")
    text = re.sub(r"(?<![\w*])\*([^*\n]+)\*(?![\w*])", r"\1", text)  # *emphasis*
    return text


def build_uids(src: Path, dst: Path) -> None:
    if src.suffix == ".gz":
        with gzip.open(src, "rt", encoding="utf-8") as fh:
            raw = fh.read()
    else:
        raw = src.read_text(encoding="utf-8")
    if raw.startswith("---\n"):
        raw = raw.split("\n---\n", 1)[1]  # drop the Jekyll front matter
    d = _new_document(
        "Users, Groups, UIDs and GIDs on systemd Systems",
        "The systemd project",
        "Converted to DOCX from systemd's docs/UIDS-GIDS.md (Debian package systemd, "
        "/usr/share/doc/systemd/UIDS-GIDS.md.gz); text unchanged, Markdown markup removed.",
    )
    lines = raw.splitlines()
    i = 0
    para: list[str] = []

    def flush() -> None:
        if para:
            text = _md_inline(_collapse(" ".join(para)))
            style = "List Paragraph" if re.match(r"\d+\. ", text) else None
            d.add_paragraph(text, style=style)
            para.clear()

    while i < len(lines):
        line = lines[i]
        s = line.strip()
        if s.startswith("```"):
            flush()
            i += 1
            while i < len(lines) and not lines[i].strip().startswith("```"):
                p = d.add_paragraph(style="No Spacing")
                run = p.add_run(lines[i].strip())
                run.font.name = "Courier New"
                run.font.size = Pt(9)
                i += 1
            i += 1
            continue
        if s.startswith("|"):
            flush()
            rows = []
            while i < len(lines) and lines[i].strip().startswith("|"):
                cells = [c.strip() for c in lines[i].strip().strip("|").split("|")]
                if not all(re.fullmatch(r"-+", c) for c in cells):
                    rows.append([_md_inline(c) for c in cells])
                i += 1
            table = d.add_table(rows=len(rows), cols=len(rows[0]))
            table.style = "Table Grid"
            for r, row in enumerate(rows):
                for c, cell in enumerate(row):
                    table.cell(r, c).text = cell
            continue
        m = re.match(r"(#+) (.*)", s)
        if m:
            flush()
            d.add_heading(_md_inline(m.group(2)), level=min(len(m.group(1)), 2))
            i += 1
            continue
        if not s:
            flush()
        elif re.match(r"\d+\. ", s) and para:
            flush()
            para.append(s)
        else:
            para.append(s)
        i += 1
    flush()
    d.save(dst)


if __name__ == "__main__":
    mpl = Path(sys.argv[1] if len(sys.argv) > 1 else "/usr/share/common-licenses/MPL-2.0")
    uids = Path(sys.argv[2] if len(sys.argv) > 2 else "/usr/share/doc/systemd/UIDS-GIDS.md.gz")
    out = Path(sys.argv[3]) if len(sys.argv) > 3 else OUT
    build_mpl(mpl, out / "mpl-2.0.docx")
    build_uids(uids, out / "systemd-uids-gids.docx")
    print("wrote", out / "mpl-2.0.docx", "and", out / "systemd-uids-gids.docx")
