"""Validate the evaluation set: eval/questions.jsonl and eval/claims.jsonl against eval/documents/.

Run:  .venv/bin/python eval/check.py        (exit status 0 when everything is valid)

Text of each document, as every check here sees it:
  .txt, .md   the raw file (UTF-8); line numbers are 1-based lines of the file as stored
  .html       the rendered text, lxml.html's text_content() of the whole page (tags dropped,
              entities decoded); line numbers are 1-based lines of the raw HTML source
  .pdf        pypdf's extract_text() of each page; pages are 1-based
  .docx       python-docx paragraph texts and table-cell texts in body order; each paragraph
              belongs to the innermost heading (Title / Heading N paragraph) before it

Matching rule for quotes and passages: a quote/passage matches a text when, after collapsing
every run of whitespace (spaces, tabs, newlines) to one space and stripping both ends, it is a
substring of that text collapsed the same way. Nothing else is normalised (case, quotes, dashes
and Unicode characters must match exactly).
"""

from __future__ import annotations

import html as html_lib
import json
import re
import sys
from collections import Counter
from functools import cache
from pathlib import Path

EVAL = Path(__file__).resolve().parent
DOCS = EVAL / "documents"
FORMATS = {".txt", ".md", ".html", ".pdf", ".docx"}
VERDICT_TRAPS = {
    "SUPPORTED": {"none", "paraphrase"},
    "PARTIAL": {"partial"},
    "UNSUPPORTED": {"number", "negation", "entity", "other_document", "unrelated"},
}


def norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


# --------------------------------------------------------------------------- document loading


@cache
def raw_lines(name: str) -> list[str]:
    return (DOCS / name).read_text(encoding="utf-8").splitlines()


@cache
def html_text(name: str) -> str:
    import lxml.html

    return norm(lxml.html.parse(str(DOCS / name)).getroot().text_content())


def html_lines_text(name: str, start: int, end: int) -> str:
    """Rendered text of raw source lines start..end: tags removed, entities decoded."""
    chunk = "\n".join(raw_lines(name)[start - 1 : end])
    # A tag that began on an earlier line ends on this one: drop its tail ("CLASS=...>").
    first_lt, first_gt = chunk.find("<"), chunk.find(">")
    if first_gt != -1 and (first_lt == -1 or first_gt < first_lt):
        chunk = chunk[first_gt + 1 :]
    chunk = re.sub(r"<!--.*?-->", "", chunk, flags=re.S)
    chunk = re.sub(r"<[/!?A-Za-z][^<>]*>", "", chunk)
    chunk = re.sub(r"<[/!?A-Za-z][^<>]*$", "", chunk)  # a tag that continues past the last line
    return norm(html_lib.unescape(chunk))


@cache
def pdf_pages(name: str) -> list[str]:
    import pypdf

    return [norm(p.extract_text() or "") for p in pypdf.PdfReader(str(DOCS / name)).pages]


@cache
def docx_blocks(name: str) -> list[tuple[str, str]]:
    """(innermost heading, text) for every paragraph and table cell, in body order."""
    import docx
    from docx.table import Table
    from docx.text.paragraph import Paragraph

    d = docx.Document(str(DOCS / name))
    out: list[tuple[str, str]] = []
    heading = ""
    for child in d.element.body.iterchildren():
        tag = child.tag.rsplit("}", 1)[-1]
        if tag == "p":
            p = Paragraph(child, d)
            style = p.style.name if p.style is not None else ""
            if style == "Title" or style.startswith("Heading"):
                heading = norm(p.text)
                out.append((heading, norm(p.text)))
            else:
                out.append((heading, norm(p.text)))
        elif tag == "tbl":
            for row in Table(child, d).rows:
                for cell in row.cells:
                    out.append((heading, norm(cell.text)))
    return out


def docx_headings(name: str) -> set[str]:
    return {h for h, _ in docx_blocks(name) if h}


def full_text(name: str) -> str:
    ext = Path(name).suffix
    if ext in {".txt", ".md"}:
        return norm("\n".join(raw_lines(name)))
    if ext == ".html":
        return html_text(name)
    if ext == ".pdf":
        return " ".join(pdf_pages(name))
    if ext == ".docx":
        return " ".join(t for _, t in docx_blocks(name))
    raise ValueError(name)


def md_heading_before(name: str, line_no: int) -> str | None:
    heading, fenced = None, False
    for line in raw_lines(name)[:line_no]:
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        m = re.match(r"#+\s+(.*)", line)
        if m and not fenced:
            heading = norm(m.group(1))
    return heading


# --------------------------------------------------------------------------- checks


class Report:
    def __init__(self) -> None:
        self.errors: list[str] = []

    def err(self, where: str, msg: str) -> None:
        self.errors.append(f"{where}: {msg}")


def load_jsonl(path: Path, rep: Report) -> list[dict]:
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            rep.err(f"{path.name}:{n}", "blank line")
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            rep.err(f"{path.name}:{n}", f"invalid JSON: {e}")
            continue
        if not isinstance(row, dict):
            rep.err(f"{path.name}:{n}", "not a JSON object")
            continue
        rows.append(row)
    return rows


def document_ok(name: object, where: str, rep: Report) -> bool:
    if not isinstance(name, str) or "/" in name or not (DOCS / name).is_file():
        rep.err(where, f"document {name!r} does not exist in eval/documents/")
        return False
    if Path(name).suffix not in FORMATS:
        rep.err(where, f"document {name!r} has an unsupported format")
        return False
    return True


def check_location(q_id: str, k: int, a: dict, rep: Report) -> None:
    where = f"{q_id} answer[{k}]"
    doc = a.get("document")
    if not document_ok(doc, where, rep):
        return
    quote = a.get("quote")
    if not isinstance(quote, str) or not norm(quote):
        rep.err(where, "quote missing or empty")
        return
    nq = norm(quote)
    if quote != nq:
        rep.err(where, "quote must be stored whitespace-collapsed (single spaces, no newlines)")
    ext = Path(doc).suffix
    if nq not in full_text(doc):
        rep.err(where, f"quote not found in {doc}: {quote!r}")
    if ext in {".txt", ".md", ".html"}:
        s, e = a.get("start_line"), a.get("end_line")
        n_lines = len(raw_lines(doc))
        if not (isinstance(s, int) and isinstance(e, int) and 1 <= s <= e <= n_lines):
            rep.err(where, f"bad line range {s}-{e} (file has {n_lines} lines)")
            return
        if ext == ".html":
            span = html_lines_text(doc, s, e)
        else:
            span = norm("\n".join(raw_lines(doc)[s - 1 : e]))
        if nq not in span:
            rep.err(
                where, f"quote not within lines {s}-{e} of {doc}: {quote!r} / lines: {span[:200]!r}"
            )
        if e - s > 40:
            rep.err(where, f"line range {s}-{e} is implausibly wide")
        h = a.get("heading")
        if h is not None and ext == ".md" and md_heading_before(doc, s) != norm(h):
            found = md_heading_before(doc, s)
            rep.err(where, f"heading {h!r} is not the innermost heading at line {s} ({found!r})")
        if h is not None and ext in {".txt", ".html"}:
            before = norm("\n".join(raw_lines(doc)[:s]))
            if ext == ".html":
                before = html_lines_text(doc, 1, s)
            if norm(h) not in before:
                rep.err(where, f"heading {h!r} does not occur before line {s}")
    elif ext == ".pdf":
        p = a.get("page")
        pages = pdf_pages(doc)
        if not (isinstance(p, int) and 1 <= p <= len(pages)):
            rep.err(where, f"bad page {p!r} ({len(pages)} pages)")
            return
        if nq not in pages[p - 1]:
            found = [i + 1 for i, t in enumerate(pages) if nq in t]
            rep.err(where, f"quote not on page {p} of {doc} (found on pages {found}): {quote!r}")
    elif ext == ".docx":
        h = a.get("heading")
        if not isinstance(h, str) or norm(h) not in docx_headings(doc):
            rep.err(where, f"heading {h!r} is not a heading of {doc}")
            return
        if not any(hh == norm(h) and nq in t for hh, t in docx_blocks(doc)):
            rep.err(where, f"quote not in one paragraph under heading {h!r}: {quote!r}")


def check_questions(rep: Report) -> dict:
    rows = load_jsonl(EVAL / "questions.jsonl", rep)
    ids = Counter(r.get("id") for r in rows)
    for i, n in ids.items():
        if n > 1:
            rep.err(f"{i}", "duplicate question id")
    texts = Counter(norm(str(r.get("question", ""))).lower() for r in rows)
    for t, n in texts.items():
        if n > 1:
            rep.err(t[:60], "duplicate question text")
    stats = {"answerable": 0, "no_answer": 0, "by_format": Counter(), "by_document": Counter()}
    for r in rows:
        q_id = str(r.get("id"))
        if not re.fullmatch(r"q\d{3}", q_id):
            rep.err(q_id, "id must look like q001")
        extra = set(r) - {"id", "question", "answer", "no_answer"}
        if extra:
            rep.err(q_id, f"unexpected keys {sorted(extra)}")
        if not isinstance(r.get("question"), str) or len(r["question"].strip()) < 10:
            rep.err(q_id, "question missing or too short")
        if not isinstance(r.get("no_answer"), bool):
            rep.err(q_id, "no_answer must be a boolean")
            continue
        ans = r.get("answer")
        if not isinstance(ans, list):
            rep.err(q_id, "answer must be a list")
            continue
        if r["no_answer"]:
            stats["no_answer"] += 1
            if ans:
                rep.err(q_id, "no-answer question must have an empty answer list")
            continue
        stats["answerable"] += 1
        if not ans:
            rep.err(q_id, "answerable question without any answer location")
        formats = set()
        for k, a in enumerate(ans):
            if not isinstance(a, dict):
                rep.err(q_id, f"answer[{k}] is not an object")
                continue
            check_location(q_id, k, a, rep)
            if isinstance(a.get("document"), str):
                formats.add(Path(a["document"]).suffix)
                stats["by_document"][a["document"]] += 1
        for f in formats:
            stats["by_format"][f] += 1
    stats["total"] = len(rows)
    return stats


def check_claims(rep: Report) -> dict:
    rows = load_jsonl(EVAL / "claims.jsonl", rep)
    ids = Counter(r.get("id") for r in rows)
    for i, n in ids.items():
        if n > 1:
            rep.err(f"{i}", "duplicate claim id")
    pairs = Counter((norm(str(r.get("claim", ""))), norm(str(r.get("passage", "")))) for r in rows)
    for (c, _), n in pairs.items():
        if n > 1:
            rep.err(c[:60], "duplicate (claim, passage) pair")
    stats = {"verdict": Counter(), "trap": Counter(), "pair": Counter(), "document": Counter()}
    for r in rows:
        c_id = str(r.get("id"))
        if not re.fullmatch(r"c\d{3}", c_id):
            rep.err(c_id, "id must look like c001")
        extra = set(r) - {"id", "claim", "passage", "document", "verdict", "trap"}
        if extra:
            rep.err(c_id, f"unexpected keys {sorted(extra)}")
        v, t = r.get("verdict"), r.get("trap")
        if v not in VERDICT_TRAPS:
            rep.err(c_id, f"bad verdict {v!r}")
        elif t not in VERDICT_TRAPS[v]:
            rep.err(c_id, f"trap {t!r} does not go with verdict {v}")
        claim, passage = r.get("claim"), r.get("passage")
        if not isinstance(claim, str) or len(claim.strip()) < 10:
            rep.err(c_id, "claim missing or too short")
        if not isinstance(passage, str) or len(passage.strip()) < 20:
            rep.err(c_id, "passage missing or too short")
            continue
        if isinstance(claim, str) and norm(claim) == norm(passage) and t == "paraphrase":
            rep.err(c_id, "a paraphrase claim must not copy the passage")
        doc = r.get("document")
        if not document_ok(doc, c_id, rep):
            continue
        np_ = norm(passage)
        if passage != np_:
            rep.err(
                c_id, "passage must be stored whitespace-collapsed (single spaces, no newlines)"
            )
        ext = Path(doc).suffix
        if ext == ".pdf":
            ok = any(np_ in p for p in pdf_pages(doc))
        elif ext == ".docx":
            ok = any(np_ in text for _, text in docx_blocks(doc))
        else:
            ok = np_ in full_text(doc)
        if not ok:
            rep.err(c_id, f"passage is not verbatim in {doc}: {passage!r}")
        if len(re.findall(r"[.!?](?:\s|$)", passage)) > 4:
            rep.err(c_id, "passage is longer than about 3 sentences")
        stats["verdict"][v] += 1
        stats["trap"][t] += 1
        stats["pair"][(v, t)] += 1
        stats["document"][doc] += 1
    stats["total"] = len(rows)
    return stats


def main() -> int:
    rep = Report()
    docs = sorted(p.name for p in DOCS.iterdir() if p.is_file())
    for name in docs:
        if Path(name).suffix not in FORMATS:
            rep.err(name, "unexpected file in eval/documents/")
    total_size = sum((DOCS / n).stat().st_size for n in docs)
    src_md = EVAL / "SOURCES.md"
    sources = src_md.read_text(encoding="utf-8") if src_md.exists() else ""
    for name in docs:
        if name not in sources:
            rep.err(name, "not described in eval/SOURCES.md")
    q = check_questions(rep)
    c = check_claims(rep)

    print(f"documents: {len(docs)} files, {total_size / 1024:.0f} KiB in total")
    for name in docs:
        print(f"  {name:34s} {(DOCS / name).stat().st_size / 1024:7.1f} KiB")
    print(f"questions: {q['total']} ({q['answerable']} answerable, {q['no_answer']} no-answer)")
    print(
        "  answerable by format: "
        + ", ".join(f"{k}={v}" for k, v in sorted(q["by_format"].items()))
    )
    print(
        "  answer locations by document: "
        + ", ".join(f"{k}={v}" for k, v in sorted(q["by_document"].items()))
    )
    print(f"claims: {c['total']}")
    print("  by verdict: " + ", ".join(f"{k}={v}" for k, v in sorted(c["verdict"].items())))
    print("  by trap: " + ", ".join(f"{k}={v}" for k, v in sorted(c["trap"].items())))
    print(
        "  by verdict/trap: " + ", ".join(f"{a}/{b}={v}" for (a, b), v in sorted(c["pair"].items()))
    )
    print("  by document: " + ", ".join(f"{k}={v}" for k, v in sorted(c["document"].items())))
    if rep.errors:
        print(f"\n{len(rep.errors)} error(s):")
        for e in rep.errors:
            print("  " + e)
        return 1
    print("\nOK: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
