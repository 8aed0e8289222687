"""Do an HTML file's cited lines hold the chunk's text? Measured on any folder of HTML files.

    .venv/bin/python bench/html_lines.py /usr/share/doc --max-chars 300
    .venv/bin/python bench/html_lines.py page.html --show 5

Each file is parsed and chunked as ingestion does, and each chunk's first and last words
(three or more letters, digits or underscores) are looked for in what a reader sees on its
cited lines of the file: the markup of those lines with the tags taken out and the entities
decoded. A chunk counts as misplaced when either word is missing. The check is a proxy, not
the truth: a word split by a tag still matches, and a range that starts in the middle of a
tag is cut to the tag's end, which a line of code can fool ("x = f(() => 1)" looks like the
end of a tag's attributes), so a few misplaced chunks on code-heavy pages are the check's. With
`--baseline REV` the code at REV (exported with git archive) is measured on the same files.
"""

from __future__ import annotations

import argparse
import html
import os
import re
import subprocess
import sys
from pathlib import Path

# The tree whose parsing and chunking are measured (a baseline's export), else this one.
TREE_VARIABLE = "FOOTNOTE_BENCH_TREE"

HTML = {".html", ".htm"}
WORD = re.compile(r"[A-Za-z0-9_]{3,}")
TAG = re.compile(r"<[^>]*>")
# A cited range may start inside a tag: the rest of its attributes, or DocBook's ">" that
# closes a tag at the start of the next line.
TAG_TAIL = re.compile(r"^[^<>]*>")
LOOKS_LIKE_ATTRIBUTES = re.compile(r"^\s*(?:/?>|[\w:.-]+\s*=)")


def visible(lines: list[str], start: int, end: int) -> str:
    fragment = "\n".join(lines[start - 1 : end])
    tail = TAG_TAIL.match(fragment)
    if tail and LOOKS_LIKE_ATTRIBUTES.match(fragment):
        fragment = fragment[tail.end() :]
    fragment = re.sub(r"<[^>]*$", "", fragment)
    return html.unescape(TAG.sub("", fragment))


def html_files(paths: list[str]) -> list[Path]:
    found: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            found += sorted(p for p in path.rglob("*") if p.suffix.lower() in HTML and p.is_file())
        elif path.is_file():
            found.append(path)
    return found


def measure(files: list[Path], max_chars: int, show: int) -> tuple[int, int]:
    from services.documents.chunking import chunk
    from services.documents.parsing import parse

    misplaced = total = 0
    for path in files:
        data = path.read_bytes()
        lines = data.decode("utf-8", errors="replace").split("\n")
        try:
            extracted = parse(data, "text/html")
        except Exception as exc:  # a file the parser refuses is not this check's business
            print(f"  skipped {path}: {exc}")
            continue
        for c in chunk(extracted, max_chars=max_chars, overlap_chars=0):
            words = WORD.findall(c.text)
            if not words:
                continue
            total += 1
            seen = visible(lines, c.start_line, c.end_line)
            if words[0] not in seen or words[-1] not in seen:
                misplaced += 1
                if misplaced <= show:
                    print(f"  {path}: lines {c.start_line}-{c.end_line} cited for {c.text[:60]!r}")
    return misplaced, total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="HTML files or folders of them")
    parser.add_argument("--max-chars", type=int, default=300)
    parser.add_argument("--show", type=int, default=0, help="print this many misplaced chunks")
    parser.add_argument("--baseline", metavar="REV", help="also measure the code at REV")
    args = parser.parse_args()
    files = html_files(args.paths)
    if args.baseline:
        from complete import main_tree

        with main_tree(args.baseline, Path("/tmp/fnbench-html-lines")) as tree:
            command = [sys.executable, __file__, *map(str, files)]
            baseline = subprocess.run(
                [*command, "--max-chars", str(args.max_chars)],
                env={**os.environ, TREE_VARIABLE: str(tree)},
                capture_output=True,
                text=True,
                check=True,
            )
        print(f"at {args.baseline}: {baseline.stdout.strip().splitlines()[-1]}")
    misplaced, total = measure(files, args.max_chars, args.show)
    share = misplaced / total if total else 0.0
    print(
        f"{len(files)} files, {total:,} chunks of {args.max_chars} characters: "
        f"{misplaced:,} misplaced ({share:.2%})"
    )


if __name__ == "__main__":
    sys.path.insert(0, os.environ.get(TREE_VARIABLE) or str(Path(__file__).resolve().parents[1]))
    main()
