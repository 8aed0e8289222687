"""Content sniffing and text extraction for every supported format, and for bad input."""

from __future__ import annotations

import codecs
import contextlib
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from services.documents.parsing import (
    CorruptDocument,
    DocumentKind,
    DocumentParseError,
    DocumentTooLarge,
    EmptyDocument,
    ParseLimits,
    UnsupportedDocument,
    extract,
    parse,
    sniff,
)
from tests.fixtures.documents.samples import (
    FIXTURES,
    as_macro_enabled,
    docx_zip_bomb,
    encrypted_pdf,
    handbook_docx,
    multipage_pdf,
    plain_zip,
)


@pytest.fixture(scope="module")
def pdf_bytes() -> bytes:
    return multipage_pdf(3)


@pytest.fixture(scope="module")
def docx_bytes() -> bytes:
    return handbook_docx()


def _titles(extracted):
    return [(heading.level, heading.title) for heading in extracted.headings]


# --- sniffing ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "declared", "filename", "expected"),
    [
        (b"just some words\n", None, None, DocumentKind.TEXT),
        (b"# Title\n\nSome text.\n", None, None, DocumentKind.MARKDOWN),
        (b"# Title\n\nSome text.\n", "text/plain", None, DocumentKind.TEXT),
        (b"# Title\n\nSome text.\n", None, "notes.txt", DocumentKind.TEXT),
        (b"plain words\n", "text/markdown; charset=utf-8", None, DocumentKind.MARKDOWN),
        (b"plain words\n", None, "README.MD", DocumentKind.MARKDOWN),
        (b"# comment\nimport os\n", None, None, DocumentKind.TEXT),
        (b"Intro\n\n## Setup\n\nSee [docs](https://x.test).\n", None, None, DocumentKind.MARKDOWN),
        (b"<!doctype html><p>hi</p>", None, None, DocumentKind.HTML),
        (b"<!DOCTYPE html><p>hi</p>", "text/markdown", "a.md", DocumentKind.HTML),
        (b"<div><p>hi</p></div>", None, None, DocumentKind.HTML),
        (b"<p>fragment", "text/html", None, DocumentKind.HTML),
        (b"<p>fragment", None, "page.htm", DocumentKind.HTML),
    ],
)
def test_sniff_text_kinds(data, declared, filename, expected) -> None:
    assert sniff(data, declared, filename) is expected


def test_content_beats_declared_type(pdf_bytes: bytes, docx_bytes: bytes) -> None:
    assert sniff(pdf_bytes, "text/plain", "notes.txt") is DocumentKind.PDF
    assert sniff(docx_bytes, "application/octet-stream", None) is DocumentKind.DOCX
    assert sniff(b"plain words after all\n", "application/pdf", "report.pdf") is DocumentKind.TEXT


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 4, "looks like a PNG image"),
        (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(512), "legacy Office file"),
        (b"{\\rtf1\\ansi Hello}", "RTF document"),
        (plain_zip({"readme.txt": b"hello"}), "looks like a ZIP archive (not DOCX)"),
        (plain_zip({"xl/workbook.xml": b"<x/>"}), "Excel workbook"),
        (b"PK\x03\x04 not really a zip", "damaged ZIP archive"),
        (b"\x00\x01\x02\x03" * 256, "binary data"),
    ],
)
def test_unsupported_files_say_what_they_look_like(data: bytes, fragment: str) -> None:
    with pytest.raises(UnsupportedDocument) as err:
        sniff(data, None, None)
    assert fragment in err.value.message
    assert "supported: plain text, Markdown, HTML, PDF, DOCX" in err.value.message
    assert err.value.reason == "UNSUPPORTED_DOCUMENT"


def test_random_bytes_are_unsupported() -> None:
    noise = random.Random(7).randbytes(64 * 1024)
    with pytest.raises(UnsupportedDocument):
        parse(noise)


def test_declared_binary_that_is_not_is_corrupt() -> None:
    with pytest.raises(CorruptDocument, match="declared as PDF"):
        sniff(random.Random(3).randbytes(4096), "application/pdf", None)
    with pytest.raises(CorruptDocument, match=r"no word/document\.xml"):
        sniff(plain_zip({"a.txt": b"x"}), None, "letter.docx")


def test_empty_and_blank_files() -> None:
    with pytest.raises(EmptyDocument, match="empty"):
        parse(b"")
    with pytest.raises(EmptyDocument):
        parse(b" \n\t\r\n  ")
    with pytest.raises(EmptyDocument):
        parse(b"<html><body><script>x()</script></body></html>")


def test_input_size_limit() -> None:
    with pytest.raises(DocumentTooLarge, match="MiB"):
        parse(b"a" * 2048, limits=ParseLimits(max_input_bytes=1024))
    with pytest.raises(DocumentTooLarge, match="characters"):
        parse(b"word " * 1000, limits=ParseLimits(max_chars=100))


# --- plain text -------------------------------------------------------------------------------


def test_legacy_encoding_is_detected() -> None:
    extracted = parse((FIXTURES / "notes-cp1252.txt").read_bytes(), None, "notes-cp1252.txt")
    assert extracted.kind is DocumentKind.TEXT
    assert extracted.encoding == "cp1252"
    assert "crème brûlée" in extracted.text
    assert "5 € per tray – see the attached naïve estimate" in extracted.text
    assert "\r" not in extracted.text
    assert extracted.pages == ()
    assert extracted.page_count is None


@pytest.mark.parametrize(
    "data",
    [
        codecs.BOM_UTF8 + "Grüße\r\nzweite Zeile".encode(),
        "Grüße\r\nzweite Zeile".encode("utf-16"),
        codecs.BOM_UTF16_BE + "Grüße\r\nzweite Zeile".encode("utf-16-be"),
        "Grüße\r\nzweite Zeile".encode("utf-16-le"),
        "Grüße\r\nzweite Zeile".encode("utf-32"),
    ],
)
def test_unicode_encodings_and_line_endings(data: bytes) -> None:
    assert parse(data).text == "Grüße\nzweite Zeile"


def test_text_drops_characters_storage_rejects() -> None:
    # A stray NUL or bell in a long text file is noise, not a sign of binary data.
    extracted = parse(b"a\x00b\x07c\rd " + b"filler words " * 40)
    assert extracted.text.startswith("abc\nd filler")


# --- Markdown ---------------------------------------------------------------------------------


def test_markdown_headings_skip_code_and_front_matter() -> None:
    extracted = parse((FIXTURES / "handbook.md").read_bytes(), None, "handbook.md")
    assert extracted.kind is DocumentKind.MARKDOWN
    assert _titles(extracted) == [
        (1, "Operator handbook"),
        (2, "Install"),
        (2, "Configuration"),
        (3, "Database"),
        (2, "Troubleshooting"),
    ]
    # The text is the source itself, so lines match the uploaded file.
    assert extracted.text == (FIXTURES / "handbook.md").read_text()
    for heading in extracted.headings:
        line = extracted.text[heading.offset :].split("\n", 1)[0]
        assert heading.title in line
        assert heading.offset == 0 or extracted.text[heading.offset - 1] == "\n"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("# One #\n## Two ##   \n", [(1, "One"), (2, "Two")]),
        ("#NotAHeading\n####### seven\n    # indented code\n", []),
        ("Para line\nstill para\n===\n", [(1, "Para line still para")]),
        ("- item\n---\n", []),
        ("text\n\n---\n", []),
        ("````md\n```\n# inside\n````\n# after\n", [(1, "after")]),
        ("# [Link](http://x) and `code`\n", [(1, "Link and code")]),
        ("```\nnever closed\n# inside\n", []),
    ],
)
def test_markdown_heading_rules(source: str, expected: list[tuple[int, str]]) -> None:
    assert _titles(extract(source.encode(), DocumentKind.MARKDOWN)) == expected


# --- HTML -------------------------------------------------------------------------------------


def test_html_keeps_reading_text_and_headings() -> None:
    extracted = parse((FIXTURES / "article.html").read_bytes(), "text/html")
    text = extracted.text
    assert extracted.kind is DocumentKind.HTML
    assert _titles(extracted) == [
        (1, "Release notes & upgrade guide"),
        (2, "Breaking changes"),
        (2, "Upgrade steps"),
    ]
    for heading in extracted.headings:
        assert text[heading.offset :].startswith(heading.title)
    for dropped in [
        "analytics", "font-family", "Pricing", "Products", "Docs", "Example Corp",
        "enable JavaScript", "template content", "hidden banner", "Related: how we test",
        "not content",
    ]:  # fmt: skip
        assert dropped not in text
    assert "Version 2.0 brings streaming answers and citations with page numbers." in text
    assert "The v1beta API is gone.\nClients must move to v1." in text
    assert "Renamed Source to CitationSource\nDropped XML output" in text
    assert "Step | Command\n1 | make migrate\n2 | make run" in text
    assert "footnote migrate\n  --state-dir /var/lib/footnote" in text
    assert "Published 3 March" in text
    assert text == text.strip()
    assert "\n\n\n" not in text


def test_html_without_closing_head_keeps_body() -> None:
    extracted = extract(
        b"<html><head><title>t</title><meta charset=utf-8><h1>Body title</h1><p>Body text",
        DocumentKind.HTML,
    )
    assert extracted.text == "Body title\n\nBody text"
    assert _titles(extracted) == [(1, "Body title")]


def test_html_legacy_charset() -> None:
    markup = '<meta charset="windows-1252"><p>Crème brûlée à la carte, naïve café</p>'
    extracted = extract(markup.encode("cp1252"), DocumentKind.HTML)
    assert extracted.text == "Crème brûlée à la carte, naïve café"


@pytest.mark.parametrize("markup", [b"<!--" * 50_000, b"</p " * 50_000, b"<p" * 100_000])
def test_html_pathological_markup_finishes(markup: bytes) -> None:
    # Python's html.parser needs minutes for inputs like these; libxml2 takes milliseconds.
    with pytest.raises(EmptyDocument):
        extract(markup, DocumentKind.HTML)


# --- PDF --------------------------------------------------------------------------------------


def test_pdf_pages_and_outline(pdf_bytes: bytes) -> None:
    extracted = parse(pdf_bytes, "application/pdf", "rollout.pdf")
    assert extracted.kind is DocumentKind.PDF
    assert extracted.page_count == 3
    for number, (start, end) in enumerate(extracted.pages, start=1):
        page_text = extracted.text[start:end]
        assert page_text.startswith(f"Chapter {number}")
        assert f"Page {number} explains step {number}" in page_text
        assert f"Page {number + 1} explains" not in page_text
    starts = [start for start, _ in extracted.pages]
    assert starts == sorted(starts)
    assert _titles(extracted) == [
        (1, "Chapter 1"),
        (1, "Chapter 2"),
        (2, "Rollback plan"),
        (1, "Chapter 3"),
    ]
    rollback = extracted.headings[2]
    assert extracted.text[rollback.offset :].startswith("Rollback plan")
    page_two = extracted.pages[1]
    assert page_two.start < rollback.offset < page_two.end


@pytest.mark.parametrize("cut", [0.1, 0.5, 0.97])
def test_truncated_pdf_is_corrupt(pdf_bytes: bytes, cut: float) -> None:
    with pytest.raises(CorruptDocument):
        parse(pdf_bytes[: int(len(pdf_bytes) * cut)])


def test_pdf_page_limit(pdf_bytes: bytes) -> None:
    with pytest.raises(DocumentTooLarge, match="3 pages"):
        parse(pdf_bytes, limits=ParseLimits(max_pages=2))


def test_password_protected_pdf_is_unsupported() -> None:
    with pytest.raises(UnsupportedDocument, match="password"):
        parse(encrypted_pdf(user_password="s3cret"))


def test_pdf_encrypted_only_for_permissions_is_read() -> None:
    extracted = parse(encrypted_pdf(user_password=""))
    assert extracted.text.startswith("Chapter 1")


def test_pdf_without_text_is_empty() -> None:
    from fpdf import FPDF

    pdf = FPDF()
    pdf.add_page()
    pdf.rect(10, 10, 50, 50)
    with pytest.raises(EmptyDocument, match="no extractable text"):
        parse(bytes(pdf.output()))


# --- DOCX -------------------------------------------------------------------------------------


def test_docx_paragraphs_tables_and_heading_styles(docx_bytes: bytes) -> None:
    extracted = parse(docx_bytes, None, "handbook.docx")
    assert extracted.kind is DocumentKind.DOCX
    assert _titles(extracted) == [
        (0, "Employee Handbook"),
        (1, "Leave"),
        (2, "Sick leave"),
        (1, "Travel"),
    ]
    for heading in extracted.headings:
        assert extracted.text[heading.offset :].startswith(heading.title)
    assert "Type | Days | Paid\nSick | 10 | yes\nUnpaid | 30 | no" in extracted.text
    assert extracted.text.index("before 10:00") < extracted.text.index("Type | Days")
    assert extracted.pages == ()


def test_docx_zip_bomb_is_rejected_before_inflating() -> None:
    # 300 MiB of zeros compresses to about 300 KiB: over both the size and the ratio limits.
    with pytest.raises(DocumentTooLarge, match="MiB"):
        parse(docx_zip_bomb(300))
    with pytest.raises(DocumentTooLarge, match="zip bomb"):
        parse(docx_zip_bomb(20))


def test_docx_limits_are_parameters(docx_bytes: bytes) -> None:
    with pytest.raises(DocumentTooLarge):
        parse(docx_bytes, limits=ParseLimits(max_uncompressed_bytes=10_000))
    with pytest.raises(DocumentTooLarge):
        parse(docx_bytes, limits=ParseLimits(max_zip_members=3))


def test_macro_enabled_word_file_is_unsupported(docx_bytes: bytes) -> None:
    with pytest.raises(UnsupportedDocument, match="DOCM"):
        parse(as_macro_enabled(docx_bytes))


def test_damaged_docx_is_corrupt(docx_bytes: bytes) -> None:
    with pytest.raises(CorruptDocument):
        parse(docx_bytes[: len(docx_bytes) // 2] + docx_bytes[-200:], None, "x.docx")
    with pytest.raises(CorruptDocument):
        parse(plain_zip({"word/document.xml": b"<not-closed"}))


# --- anything at all --------------------------------------------------------------------------

_PREFIXES = [
    b"",
    b"%PDF-1.7\n",
    b"PK\x03\x04",
    b"<!DOCTYPE html><html><body>",
    b"<h1>",
    b"# ",
    codecs.BOM_UTF8,
    codecs.BOM_UTF16_LE,
    codecs.BOM_UTF32_BE,
    b"{\\rtf1",
]
_CONTENT_TYPES = [None, "text/plain", "text/html", "text/markdown", "application/pdf"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prefix=st.sampled_from(_PREFIXES),
    body=st.binary(max_size=2048),
    declared=st.sampled_from(_CONTENT_TYPES),
    filename=st.sampled_from([None, "a.txt", "a.md", "a.html", "a.pdf", "a.docx"]),
)
def test_arbitrary_bytes_raise_only_parse_errors(prefix, body, declared, filename) -> None:
    try:
        extracted = parse(prefix + body, declared, filename)
    except DocumentParseError as err:
        assert err.message
        return
    assert extracted.text.strip()
    assert "\x00" not in extracted.text
    assert all(0 <= heading.offset <= len(extracted.text) for heading in extracted.headings)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_damaged_pdf_and_docx_raise_only_parse_errors(
    data: st.DataObject, pdf_bytes: bytes, docx_bytes: bytes
) -> None:
    original = bytearray(data.draw(st.sampled_from([pdf_bytes, docx_bytes])))
    for _ in range(data.draw(st.integers(1, 8))):
        position = data.draw(st.integers(0, len(original) - 1))
        original[position] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(1, len(original)))
    for kind in (None, DocumentKind.PDF, DocumentKind.DOCX):
        with contextlib.suppress(DocumentParseError):
            if kind is None:
                parse(bytes(original[:cut]))
            else:
                extract(bytes(original[:cut]), kind)


@settings(max_examples=150, deadline=None)
@given(text=st.text(max_size=500), kind=st.sampled_from(list(DocumentKind)))
def test_any_text_in_any_kind_raises_only_parse_errors(text: str, kind: DocumentKind) -> None:
    with contextlib.suppress(DocumentParseError):
        extract(text.encode("utf-8", "surrogatepass"), kind)
