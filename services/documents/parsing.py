"""Detect a document's kind from its bytes and extract its text with pages and headings."""

from __future__ import annotations

import codecs
import io
import re
import zipfile
from pathlib import PurePosixPath

import charset_normalizer

from services.documents.docx_text import extract_docx
from services.documents.extracted import (
    MAX_TITLE_CHARS,
    SUPPORTED_KINDS_TEXT,
    Budget,
    CorruptDocument,
    DocumentKind,
    DocumentParseError,
    DocumentTooLarge,
    EmptyDocument,
    ExtractedText,
    Heading,
    LineMark,
    PageSpan,
    ParseLimits,
    UnsupportedDocument,
    heading_title,
    normalize_text,
)
from services.documents.html_text import extract_html
from services.documents.pdf_text import extract_pdf
from services.documents.text_headings import text_headings

__all__ = [
    "CorruptDocument",
    "DocumentKind",
    "DocumentParseError",
    "DocumentTooLarge",
    "EmptyDocument",
    "ExtractedText",
    "Heading",
    "PageSpan",
    "ParseLimits",
    "UnsupportedDocument",
    "decode_text",
    "extract",
    "markdown_headings",
    "parse",
    "sniff",
]

_DEFAULT_LIMITS = ParseLimits()

# The PDF specification lets the header start anywhere in the first 1024 bytes.
_PDF_HEADER_WINDOW = 1024
_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")
_DOCX_MAIN_PART = "word/document.xml"

# Recognised only to tell the uploader what they sent; none of these can be indexed.
_BINARY_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "a legacy Office file (.doc/.xls/.ppt) or a "
     "password-protected Office document; save it as DOCX without a password"),
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF87a", "a GIF image"),
    (b"GIF89a", "a GIF image"),
    (b"II*\x00", "a TIFF image"),
    (b"MM\x00*", "a TIFF image"),
    (b"\x1f\x8b", "a gzip archive"),
    (b"BZh", "a bzip2 archive"),
    (b"\xfd7zXZ\x00", "an xz archive"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive"),
    (b"Rar!\x1a\x07", "a RAR archive"),
    (b"\x7fELF", "an executable program"),
    (b"MZ", "a Windows executable program"),
    (b"ID3", "an MP3 audio file"),
    (b"OggS", "an Ogg media file"),
    (b"\x00\x00\x00\x18ftyp", "an MP4 video"),
    (b"\x00\x00\x00\x20ftyp", "an MP4 video"),
    (b"SQLite format 3\x00", "an SQLite database"),
)  # fmt: skip
_ZIP_FLAVOURS: tuple[tuple[str, str], ...] = (
    ("xl/workbook.xml", "an Excel workbook (XLSX)"),
    ("ppt/presentation.xml", "a PowerPoint presentation (PPTX)"),
    ("META-INF/container.xml", "an EPUB e-book"),
    ("content.xml", "an OpenDocument file (ODT/ODS/ODP); save it as DOCX"),
)
_BOMS: tuple[tuple[bytes, str], ...] = (
    # UTF-32-LE's BOM starts with UTF-16-LE's, so it is tried first.
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)
# Detection only needs a sample; decoding always covers the whole file.
_DETECTION_SAMPLE_BYTES = 256 * 1024
# Text files carry a stray control character now and then; binary data is full of them.
_MAX_BINARY_CHAR_RATIO = 0.01
_BINARY_CHARS = re.compile("[\x00-\x08\x0e-\x1a\x1c-\x1f\x7f\ufffd]")

_MARKDOWN_TYPES = frozenset({"text/markdown", "text/x-markdown", "text/x-gfm"})
_HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
_PLAIN_TYPES = frozenset({"text/plain"})
_MARKDOWN_SUFFIXES = frozenset({".md", ".markdown", ".mdown", ".mkd", ".mkdn", ".mdx"})
_HTML_SUFFIXES = frozenset({".html", ".htm", ".xhtml"})
_PLAIN_SUFFIXES = frozenset({".txt", ".text", ".log", ".csv", ".tsv", ".rst"})
_DECLARABLE: dict[str, DocumentKind] = {
    "application/pdf": DocumentKind.PDF,
    ".pdf": DocumentKind.PDF,
    DocumentKind.DOCX.content_type: DocumentKind.DOCX,
    ".docx": DocumentKind.DOCX,
}

# Tags that start an HTML document as browsers sniff it (WHATWG MIME sniffing, section 7.1).
_HTML_DOCUMENT_START = re.compile(
    r"\s*(?:<\?xml[^>]*>\s*)?(?:<!--.*?-->\s*)*<(?:!doctype\s+html|html)[\s>]",
    re.IGNORECASE | re.DOTALL,
)
_HTML_FRAGMENT_START = re.compile(
    r"\s*<(?:head|body|script|iframe|h[1-6]|div|font|table|a|style|title|b|br|p|!--)[\s>/]",
    re.IGNORECASE,
)
_HTML_CLOSING_TAG = re.compile(
    r"</(?:html|head|body|div|p|a|table|h[1-6]|title)\s*>", re.IGNORECASE
)
_RTF_START = re.compile(rb"\s*\{\\rtf")
_MARKUP_SNIFF_CHARS = 4096

_ATX_OPENING = re.compile(r" {0,3}(#{1,6})(?=[ \t]|$)")
_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})(.*)")
_SETEXT_UNDERLINE = re.compile(r" {0,3}(=+|-+)[ \t]*")
_FRONT_MATTER_END = re.compile(r"(?:---|\.\.\.)[ \t]*")
# Bounded repeats keep both linear on lines like "[[[[[[...".
_INLINE_LINK = re.compile(r"!?\[([^\[\]\n]{0,500})\]\([^()\n]{0,2000}\)")
_MARKDOWN_LINK = re.compile(r"\[[^\[\]\n]{1,500}\]\([^()\s]{1,2000}\)")
_PARAGRAPH_BREAKER = re.compile(
    r" {0,3}(?:[-*+](?:[ \t]|$)|>|\d{1,9}[.)](?:[ \t]|$)|#{1,6}(?:[ \t]|$)|`{3}|~{3}|<)"
)


def check_size(data: bytes, limits: ParseLimits) -> None:
    """Refuses an empty file and one over the input limit, before any parsing."""
    if not data:
        raise EmptyDocument("the file is empty")
    if len(data) > limits.max_input_bytes:
        raise DocumentTooLarge(
            f"the file is {len(data) / 2**20:,.1f} MiB, more than the limit of "
            f"{limits.max_input_bytes / 2**20:,.0f} MiB"
        )


def sniff(
    data: bytes,
    declared_content_type: str | None = None,
    filename: str | None = None,
    *,
    limits: ParseLimits = _DEFAULT_LIMITS,
) -> DocumentKind:
    """Decide the document's kind from its content; the declared type and name only break ties.

    Raises EmptyDocument, DocumentTooLarge, CorruptDocument or UnsupportedDocument.
    """
    check_size(data, limits)
    media_type = _media_type(declared_content_type)
    suffix = PurePosixPath(filename or "").suffix.lower()
    declared = _DECLARABLE.get(media_type) or _DECLARABLE.get(suffix)

    if data.lstrip(b"\x00\t\n\r\f ").startswith(b"%PDF-"):
        return DocumentKind.PDF
    if data.startswith(_ZIP_MAGIC):
        return _sniff_zip(data, declared)
    if _RTF_START.match(data):
        raise UnsupportedDocument(_unsupported("an RTF document; save it as DOCX or plain text"))

    decoded = decode_text(
        data[:_DETECTION_SAMPLE_BYTES], final=len(data) <= _DETECTION_SAMPLE_BYTES
    )
    if decoded is None:
        if b"%PDF-" in data[:_PDF_HEADER_WINDOW]:
            return DocumentKind.PDF
        if declared is not None:
            raise CorruptDocument(
                f"the file is declared as {declared.name} but its content is not "
                f"{_article(declared.name)} {declared.name} file; it may be damaged"
            )
        raise UnsupportedDocument(_unsupported(_describe_binary(data)))
    text = decoded[0]
    head = text[:_MARKUP_SNIFF_CHARS]
    if _HTML_DOCUMENT_START.match(head):
        return DocumentKind.HTML
    if media_type in _HTML_TYPES or suffix in _HTML_SUFFIXES:
        return DocumentKind.HTML
    if media_type in _MARKDOWN_TYPES or suffix in _MARKDOWN_SUFFIXES:
        return DocumentKind.MARKDOWN
    if media_type in _PLAIN_TYPES or suffix in _PLAIN_SUFFIXES:
        return DocumentKind.TEXT
    if _HTML_FRAGMENT_START.match(head) and _HTML_CLOSING_TAG.search(text):
        return DocumentKind.HTML
    if _looks_like_markdown(text):
        return DocumentKind.MARKDOWN
    return DocumentKind.TEXT


def extract(
    data: bytes, kind: DocumentKind, *, limits: ParseLimits = _DEFAULT_LIMITS
) -> ExtractedText:
    """Extract the text that chunk offsets, lines and pages refer to.

    Raises only DocumentParseError subclasses, whatever the bytes.
    """
    check_size(data, limits)
    budget = Budget(limits)
    encoding: str | None = None
    pages: tuple[PageSpan, ...] = ()
    headings: tuple[Heading, ...] = ()
    line_marks: tuple[LineMark, ...] = ()
    paragraphs: tuple[int, ...] = ()
    if kind is DocumentKind.PDF:
        text, pages, headings = extract_pdf(data, budget)
    elif kind is DocumentKind.DOCX:
        text, headings, paragraphs = extract_docx(data, budget)
    else:
        text, encoding = _decode_document(data, kind)
        if kind is DocumentKind.HTML:
            # Markup is bounded by the input size; the limit applies to the text it yields.
            text, headings, line_marks = extract_html(text, budget)
        else:
            budget.add_chars(len(text))
            if kind is DocumentKind.MARKDOWN:
                headings = markdown_headings(text)
            else:
                headings = text_headings(text)
    if not text.strip():
        raise EmptyDocument("the file contains no text")
    return ExtractedText(
        kind=kind,
        text=text,
        pages=pages,
        headings=headings,
        encoding=encoding,
        line_marks=line_marks,
        paragraphs=paragraphs,
    )


def parse(
    data: bytes,
    declared_content_type: str | None = None,
    filename: str | None = None,
    *,
    limits: ParseLimits = _DEFAULT_LIMITS,
) -> ExtractedText:
    """Sniff, then extract."""
    kind = sniff(data, declared_content_type, filename, limits=limits)
    return extract(data, kind, limits=limits)


def decode_text(data: bytes, *, final: bool = True) -> tuple[str, str] | None:
    """Decode bytes as text, returning (text, encoding), or None when they look binary.

    With final=False the bytes are a prefix, and a character cut at its end is not an error.
    """
    decoded = _decode_with_detection(data, final)
    if decoded is None or _looks_binary(decoded[0]):
        return None
    return decoded


def markdown_headings(text: str) -> tuple[Heading, ...]:
    """ATX and setext headings, skipping front matter and fenced code; offsets at line starts."""
    headings: list[Heading] = []
    lines = text.split("\n")
    starts = _line_starts(lines)
    index = _skip_front_matter(lines)
    fence: str | None = None
    paragraph_start: int | None = None
    while index < len(lines):
        line = lines[index]
        if fence is not None:
            if _closes_fence(line, fence):
                fence = None
            index += 1
            continue
        opening = _FENCE.fullmatch(line)
        if opening and not (opening.group(1)[0] == "`" and "`" in opening.group(2)):
            fence = opening.group(1)
            paragraph_start = None
        elif (atx := _ATX_OPENING.match(line)) is not None:
            title = _clean_title(_atx_title(line[atx.end() :]))
            if title:
                headings.append(Heading(starts[index], len(atx.group(1)), title))
            paragraph_start = None
        elif (
            underline := _SETEXT_UNDERLINE.fullmatch(line)
        ) is not None and paragraph_start is not None:
            title = _clean_title(" ".join(lines[paragraph_start:index]))
            if title:
                level = 1 if underline.group(1)[0] == "=" else 2
                headings.append(Heading(starts[paragraph_start], level, title))
            paragraph_start = None
        elif not line.strip() or (line.startswith(("    ", "\t")) and paragraph_start is None):
            paragraph_start = None
        elif paragraph_start is None:
            # Setext underlines only turn plain paragraph text into a heading, not list items,
            # quotes or HTML blocks.
            paragraph_start = None if _PARAGRAPH_BREAKER.match(line) else index
        index += 1
    return tuple(headings)


def _closes_fence(line: str, fence: str) -> bool:
    closing = _FENCE.fullmatch(line)
    return (
        closing is not None
        and closing.group(1)[0] == fence[0]
        and len(closing.group(1)) >= len(fence)
        and not closing.group(2).strip()
    )


def _sniff_zip(data: bytes, declared: DocumentKind | None) -> DocumentKind:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = set(archive.namelist())
            mimetype = _read_small_member(archive, "mimetype", names)
    except Exception as err:
        if declared is DocumentKind.DOCX:
            message = "the DOCX file is not a readable ZIP archive; it may be damaged"
            raise CorruptDocument(message) from err
        raise UnsupportedDocument(_unsupported("a damaged ZIP archive")) from err
    if _DOCX_MAIN_PART in names:
        return DocumentKind.DOCX
    if declared is DocumentKind.DOCX:
        raise CorruptDocument(
            f"the file is declared as DOCX but the archive has no {_DOCX_MAIN_PART}; "
            "it may be damaged"
        )
    if mimetype == "application/epub+zip":
        raise UnsupportedDocument(_unsupported("an EPUB e-book"))
    for marker, description in _ZIP_FLAVOURS:
        if marker in names:
            raise UnsupportedDocument(_unsupported(description))
    raise UnsupportedDocument(_unsupported("a ZIP archive (not DOCX)"))


def _read_small_member(archive: zipfile.ZipFile, name: str, names: set[str]) -> str | None:
    if name not in names or archive.getinfo(name).file_size > 100:
        return None
    return archive.read(name).decode("ascii", "replace").strip()


def _decode_document(data: bytes, kind: DocumentKind) -> tuple[str, str]:
    decoded = decode_text(data)
    if decoded is None:
        raise UnsupportedDocument(
            f"the file was expected to be {kind.name} text but does not decode as text in any "
            "known encoding; save it as UTF-8"
        )
    text, encoding = decoded
    return normalize_text(text), encoding


def _decode_with_detection(data: bytes, final: bool) -> tuple[str, str] | None:
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            text = _strict_decode(data[len(bom) :], encoding, final)
            return None if text is None else (text, encoding)
    if b"\x00" in data[:_DETECTION_SAMPLE_BYTES]:
        encoding = _bomless_utf16(data)
        text = None if encoding is None else _strict_decode(data, encoding, final)
        if encoding is not None and text is not None:
            return text, encoding
    text = _strict_decode(data, "utf-8", final)
    if text is not None:
        return text, "utf-8"
    matches = charset_normalizer.from_bytes(data[:_DETECTION_SAMPLE_BYTES])
    best = matches.best()
    if best is None:
        return None
    encoding = best.encoding
    # Short Western text decodes equally well as several code pages and the detector then picks
    # the first; cp1252 is by far the likeliest of those, as browsers assume.
    ties = {m.encoding for m in matches if (m.chaos, m.coherence) == (best.chaos, best.coherence)}
    if "cp1252" in ties:
        encoding = "cp1252"
    try:
        return data.decode(encoding, errors="replace"), encoding
    except LookupError:
        return None


def _strict_decode(data: bytes, encoding: str, final: bool) -> str | None:
    decoder = codecs.getincrementaldecoder(encoding)()
    try:
        return decoder.decode(data, final=final)
    except UnicodeDecodeError:
        return None


def _bomless_utf16(data: bytes) -> str | None:
    sample = data[:_DETECTION_SAMPLE_BYTES]
    if len(sample) < 4:
        return None
    even_zeros = sample[0::2].count(0) / (len(sample) / 2)
    odd_zeros = sample[1::2].count(0) / (len(sample) / 2)
    # ASCII-range text in UTF-16 has a zero in every other byte, and almost none in the others.
    if odd_zeros > 0.3 and even_zeros < 0.05:
        return "utf-16-le"
    if even_zeros > 0.3 and odd_zeros < 0.05:
        return "utf-16-be"
    return None


def _looks_binary(text: str) -> bool:
    if not text:
        return False
    return len(_BINARY_CHARS.findall(text)) > _MAX_BINARY_CHAR_RATIO * len(text)


def _looks_like_markdown(text: str) -> bool:
    lines = text.split("\n")
    headings = markdown_headings(text)
    fences = sum(1 for line in lines if _FENCE.fullmatch(line)) // 2
    links = min(len(_MARKDOWN_LINK.findall(text)), 2)
    if not headings and not fences:
        return False
    # A lone "# comment" line is common in plain text and code; Markdown shows more than that,
    # or at least a title set off from the text below it.
    first = next((i for i, line in enumerate(lines) if line.strip()), 0)
    titled = _ATX_OPENING.match(lines[first]) is not None and (
        first + 1 == len(lines) or not lines[first + 1].strip()
    )
    return titled or len(headings) + fences + links >= 2


def _skip_front_matter(lines: list[str]) -> int:
    if not lines or lines[0].rstrip() != "---":
        return 0
    for index in range(1, len(lines)):
        if _FRONT_MATTER_END.fullmatch(lines[index]):
            return index + 1
    return 0


def _line_starts(lines: list[str]) -> list[int]:
    starts: list[int] = []
    offset = 0
    for line in lines:
        starts.append(offset)
        offset += len(line) + 1
    return starts


def _atx_title(rest: str) -> str:
    rest = rest.strip(" \t")
    # A closing run of #s is dropped only when it stands apart: "# C#" keeps its title.
    without_closing = rest.rstrip("#")
    if not without_closing:
        return ""
    if without_closing != rest and without_closing.endswith((" ", "\t")):
        return without_closing.rstrip(" \t")
    return rest


def _clean_title(raw: str) -> str:
    return heading_title(_INLINE_LINK.sub(r"\1", raw[: MAX_TITLE_CHARS * 4]).replace("`", ""))


def _media_type(content_type: str | None) -> str:
    return (content_type or "").split(";", 1)[0].strip().lower()


def _describe_binary(data: bytes) -> str:
    for signature, description in _BINARY_SIGNATURES:
        if data.startswith(signature):
            return description
    return "binary data"


def _unsupported(looks_like: str) -> str:
    return f"unsupported file type: looks like {looks_like}; supported: {SUPPORTED_KINDS_TEXT}"


def _article(word: str) -> str:
    return "an" if word[:1].upper() in "AEIOU" else "a"
