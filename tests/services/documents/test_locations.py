"""Citation locations point into the uploaded file: open it at the cited lines and find the text."""

from __future__ import annotations

import io
import re

import docx
import pytest
from lxml import html as lxml_html

from services.documents.chunking import chunk
from services.documents.parsing import parse
from services.documents.text_headings import text_headings
from tests.fixtures.documents.samples import FIXTURES, handbook_docx, multipage_pdf

WORD = re.compile(r"[A-Za-z0-9_]{2,}")

# DocBook output closes tags at the start of the next line, so text starts below its tag.
DOCBOOK = """<!DOCTYPE HTML PUBLIC "-//W3C//DTD HTML 4.01//EN">
<HTML
><HEAD
><TITLE
>Users and groups</TITLE
><META
NAME="GENERATOR"
CONTENT="Modular DocBook HTML Stylesheet Version 1.79"></HEAD
><BODY
><H1
>Users and groups</H1
><DL
><DT
>operator</DT
><DD
><P
>\t    Operator is historically (and practically) a no-login account
\t    with the UID 37 &amp; it is kept for compatibility.
\t  </P
></DD
><DT
>dip</DT
><DD
><P
>\t    Dialup IP. Tools such as ppp, dip, wvdial, etc.
\t    need it to open the serial port and dial out.
\t  </P
></DD
></DL
>
<!-- a comment that spans
     two lines -->
<P>Members of <B>staff</B> may modify
the local system without root.</P>
</BODY
></HTML
>
"""


# What Sphinx and other generators write: permalinks in headings, an address written with
# entities (its "." found as it stands matched a full stop further down, and every later text
# was placed there), start tags over two lines, a title attribute repeating the link's text,
# and words that are also tag names.
GENERATED = """<!DOCTYPE html>
<html><head><title>Python policy</title></head>
<body>
<h1>Python policy<a class="headerlink" href="#policy" title="Permalink to this heading">¶</a></h1>
<ul>
<li><p>Neil Schemenauer &lt;<a href="mailto:nas&#37;&#52;&#48;debian&#46;org"
>nas<span>&#64;</span>debian<span>&#46;</span>org</a>&gt;</p></li>
</ul>
<h2>Versions<a class="headerlink" href="#versions">¶</a></h2>
<p>The supported versions are listed in
debian_defaults under share and python3</p>
<p>Packages call py3versions to learn them;
they never hard code a version</p>
<p>
  You may also read the <a
  href="docs/annotated.html" title="modular version">annotated source</a>; there is a <a
  href="docs/modules.html">modular version</a> with clickable
  import references as well
</p>
<h2 id="errors">Errors <a href="#errors">#</a></h2>
<p>The stream is closed with the standard <code>INTERNAL_ERROR</code>
code and the callback is called.</p>
</body></html>
"""


def visible_text(lines: list[str], start: int, end: int) -> str:
    """The text a reader sees on lines start..end of an HTML file."""
    fragment = "\n".join(lines[start - 1 : end])
    # A cited range can start or end inside a tag; cut to whole tags before rendering.
    fragment = re.sub(r"^[^<]*?>", "", fragment)
    fragment = re.sub(r"<[^>]*$", "", fragment)
    return " ".join(lxml_html.fromstring(f"<div>{fragment}</div>").text_content().split())


@pytest.mark.parametrize("max_chars", [80, 160, 1200])
def test_html_lines_are_lines_of_the_markup(max_chars: int) -> None:
    extracted = parse(DOCBOOK.encode(), "text/html")
    lines = DOCBOOK.split("\n")
    chunks = chunk(extracted, max_chars=max_chars, overlap_chars=20)
    assert chunks
    for c in chunks:
        assert 1 <= c.start_line <= c.end_line <= len(lines)
        seen = visible_text(lines, c.start_line, c.end_line)
        words = WORD.findall(c.text)
        for word in (*words[:2], *words[-2:]):
            assert word in seen, (word, c.start_line, c.end_line, c.text)


@pytest.mark.parametrize("max_chars", [40, 80, 400])
def test_generated_html_lines_hold_their_text(max_chars: int) -> None:
    extracted = parse(GENERATED.encode(), "text/html")
    lines = GENERATED.split("\n")
    chunks = chunk(extracted, max_chars=max_chars, overlap_chars=0)
    for c in chunks:
        assert 1 <= c.start_line <= c.end_line <= len(lines)
        seen = visible_text(lines, c.start_line, c.end_line)
        words = WORD.findall(c.text)
        for word in (words[0], words[-1]):
            assert word in seen, (word, c.start_line, c.end_line, c.text)

    def line_of(word: str) -> int:
        return next(n for n, line in enumerate(lines, 1) if word in line)

    for word in ("debian_defaults", "never", "clickable", "callback"):
        holder = next(c for c in chunks if word in c.text)
        assert holder.start_line <= line_of(word) <= holder.end_line, (word, holder)


def test_html_chunks_carry_their_line_marks() -> None:
    lines = GENERATED.split("\n")
    html_chunks = chunk(parse(GENERATED.encode(), "text/html"), max_chars=80, overlap_chars=0)
    for c in html_chunks:
        offsets, marked = c.line_marks[0::2], c.line_marks[1::2]
        assert offsets[0] == 0 and marked[0] == c.start_line and marked[-1] <= c.end_line
        assert list(offsets) == sorted(offsets) and all(o < len(c.text) for o in offsets)
        # Each marked piece of text starts on its line of the markup.
        for offset, line in zip(offsets, marked, strict=True):
            word = WORD.search(c.text, offset)
            if word is not None and word.start() - offset < 3:
                assert word.group() in visible_text(lines, line, line + 1), (word.group(), line)
    text_chunks = chunk(parse(PLAIN.encode(), "text/plain"), max_chars=80, overlap_chars=0)
    assert all(c.line_marks == () for c in text_chunks)


def test_heading_permalinks_are_not_text() -> None:
    extracted = parse(GENERATED.encode(), "text/html")
    assert [h.title for h in extracted.headings] == ["Python policy", "Versions", "Errors"]
    assert "¶" not in extracted.text and "Errors #" not in extracted.text


def test_html_cited_lines_hold_the_paragraph() -> None:
    extracted = parse(DOCBOOK.encode(), "text/html")
    lines = DOCBOOK.split("\n")
    staff = next(c for c in chunk(extracted, max_chars=80, overlap_chars=0) if "staff" in c.text)
    # The paragraph sits after a two-line comment: its lines are those of the file.
    first = next(n for n, line in enumerate(lines, 1) if "Members of" in line)
    assert staff.start_line == first
    assert "without root" in lines[staff.end_line - 1]
    operator = next(
        c for c in chunk(extracted, max_chars=100, overlap_chars=0) if "UID 37" in c.text
    )
    assert "UID 37" in "\n".join(lines[operator.start_line - 1 : operator.end_line])


def test_article_fixture_lines_hold_their_text() -> None:
    source = (FIXTURES / "article.html").read_text()
    lines = source.split("\n")
    extracted = parse(source.encode(), "text/html")
    for c in chunk(extracted, max_chars=120, overlap_chars=0):
        seen = visible_text(lines, c.start_line, c.end_line)
        for word in WORD.findall(c.text)[:3]:
            assert word in seen, (word, c)
    upgrade = next(
        c for c in chunk(extracted, max_chars=60, overlap_chars=0) if "make run" in c.text
    )
    assert "make run" in lines[upgrade.end_line - 1]


def test_docx_chunks_carry_paragraph_numbers_and_no_lines() -> None:
    data = handbook_docx()
    paragraphs = [p.text for p in docx.Document(io.BytesIO(data)).paragraphs if p.text.strip()]
    extracted = parse(data)
    chunks = chunk(extracted, max_chars=120, overlap_chars=0)
    for c in chunks:
        assert c.start_line == c.end_line == 0
        assert c.paragraph_start is not None and c.paragraph_end is not None
        assert 1 <= c.paragraph_start <= c.paragraph_end
    travel = next(c for c in chunks if "travel portal" in c.text)
    # Paragraphs count the non-empty body paragraphs in order, the table counting as one.
    body = [*paragraphs[:5], "<table>", *paragraphs[5:]]
    assert "travel portal" in body[travel.paragraph_end - 1]
    assert travel.heading_path[-1] == "Travel"


def test_pdf_chunks_have_pages_not_lines() -> None:
    for c in chunk(parse(multipage_pdf(2)), max_chars=300, overlap_chars=0):
        assert c.start_line == c.end_line == 0 and c.page_start and c.paragraph_start is None


PLAIN = """                    SAMPLE LICENSE

                        Preamble

  Everyone may copy this text.

                  TERMS AND CONDITIONS

  0. Definitions.

  "Work" means the program.

  1. Grant of Rights. Subject to the terms of this License, you may
  copy the Work.

  2.1 Scope

  It covers copies.
  7.  This requirement modifies the requirement in section 4 to
  "keep intact all notices".

Section 3 - Termination

ARTICLE IV

Steps to follow:
1. Install the package
2. Run it
"""


def test_plain_text_gets_numbered_and_titled_sections_as_headings() -> None:
    found = {(h.level, h.title) for h in text_headings(PLAIN)}
    assert (1, "Preamble") in found
    assert (1, "TERMS AND CONDITIONS") in found
    assert (2, "0. Definitions.") in found
    assert (2, "1. Grant of Rights") in found
    assert (3, "2.1 Scope") in found
    assert (2, "Section 3 - Termination") in found
    assert (1, "ARTICLE IV") in found
    titles = {title for _, title in found}
    # Sentences and list items are not headings.
    assert not any(t.startswith(("7.", "1. Install", "2. Run")) for t in titles)
    assert "SAMPLE LICENSE" in titles
    for heading in text_headings(PLAIN):
        assert (
            PLAIN[heading.offset : heading.offset + 200]
            .strip()
            .startswith(heading.title.split()[0])
        )


UNDERLINED = """TRIGGERS
========

Introduction
------------
A dpkg trigger records events caused by one package.

Name    Value
-----   -----

Concepts
--------

Each trigger has a name.

A line of prose
---

Each trigger is activated once.
-------------------------------

"""


def test_plain_text_titles_underlined_as_long_as_they_are_headings() -> None:
    found = [(h.level, h.title) for h in text_headings(UNDERLINED)]
    assert found == [(1, "TRIGGERS"), (2, "Concepts")]
    # "Introduction" runs into its text (as table headers over a rule do), a table header's
    # underline has gaps, a short rule under a long line is a rule, and a sentence over a rule
    # is not a title.
    extracted = parse(UNDERLINED.encode(), "text/plain")
    piece = next(c for c in chunk(extracted, max_chars=400, overlap_chars=0) if "name" in c.text)
    assert piece.heading_path == ("TRIGGERS", "Concepts")


def test_plain_text_chunks_carry_heading_paths_and_file_lines() -> None:
    extracted = parse(PLAIN.encode(), "text/plain")
    lines = PLAIN.split("\n")
    chunks = chunk(extracted, max_chars=120, overlap_chars=0)
    grant = next(c for c in chunks if "Grant of Rights" in c.text)
    assert grant.heading_path == ("TERMS AND CONDITIONS", "1. Grant of Rights")
    assert "Grant of Rights" in lines[grant.start_line - 1]
    assert "copy the Work." in lines[grant.end_line - 1]
