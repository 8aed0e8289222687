"""Marker grammar, what is ignored, and how invalid markers are rewritten or removed."""

import pytest

from services.citations.extract import MAX_MARKER_CHARS, extract


def refs(text: str, n: int = 3) -> tuple[tuple[int, ...], tuple[int, ...]]:
    result = extract(text, n)
    return result.referenced_indices, result.invalid_indices


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Revenue grew [1].", (1,)),
        ("Both [1][3].", (1, 3)),
        ("Both [1, 2].", (1, 2)),
        ("Both [1,2] and [ 3 ].", (1, 2, 3)),
        ("All [1-3].", (1, 2, 3)),
        ("All [1 - 3] and [3–1].", (1, 2, 3)),
        ("Mixed [1, 2-3].", (1, 2, 3)),
        ("Full-width 【2】 and 【1、3】.", (1, 2, 3)),
        ("Full-width digits 【２】.", (2,)),
        ("No space before it[2].", (2,)),
        ("Duplicates [2][2, 2] [2-2].", (2,)),
        ("Out of order [3][1].", (1, 3)),
    ],
)
def test_markers_are_read(text: str, expected: tuple[int, ...]) -> None:
    assert refs(text) == (expected, ())


@pytest.mark.parametrize(
    "text",
    [
        "Inline `code [1]` only.",
        "Double ``code ` [1]`` only.",
        "```\nfenced [1]\n```",
        "~~~python\nfenced [1]\n~~~",
        "   ```\nindented fence [1]\n   ```",
        "````\n```\nlonger fence [1]\n````",
        "```\nnever closed [1]",
        "A [link](http://x.test/[1]) here.",
        "A numbered link [1](http://x.test).",
        "An image ![2](pic.png).",
        "A footnote[^1] and its text.\n\n[^1]: note",
        "Escaped \\[1] bracket.",
        "Empty [] and [ ] and [,] and [1,] and [-1] and [1 2].",
        "Years [2024] are not markers.",
        "Mismatched [1】 and 【1].",
        "Words [one] and [a1].",
    ],
)
def test_ignored(text: str) -> None:
    assert refs(text) == ((), ())


def test_marker_after_code_still_counts() -> None:
    assert refs("`a [1]` b [2]\n```\n[3]\n```\nc [1]") == ((1, 2), ())


def test_unclosed_backtick_is_literal() -> None:
    # Code spans close on the same line; a lone backtick opens nothing.
    assert refs("Use the ` key [1].\nThen `x` [2]") == ((1, 2), ())


def test_backtick_fence_with_backtick_info_is_inline_code() -> None:
    assert refs("```a [1]``` [2]") == ((2,), ())


def test_escaped_backslash_does_not_escape_the_bracket() -> None:
    assert refs("Path C:\\\\[2]") == ((2,), ())


def test_fence_closer_must_be_long_enough_and_bare() -> None:
    assert refs("````\n```\n[1]\n```` \n[2]") == ((2,), ())
    assert refs("```\n```py\n[1]\n```\n[2]") == ((2,), ())


def test_out_of_range_is_invalid_never_referenced() -> None:
    assert refs("A [0] b [4] c [2] d [99][4]") == ((2,), (0, 4, 99))


def test_ranges_are_clipped_and_report_written_ends() -> None:
    assert refs("[2-999]") == ((2, 3), (999,))
    assert refs("[5-9]") == ((), (5, 9))
    assert refs("[0-1]") == ((1,), (0,))


def test_no_sources_makes_every_number_invalid() -> None:
    assert refs("[1][2]", n=0) == ((), (1, 2))


def test_overlong_marker_is_text() -> None:
    body = ", ".join(["1"] * 40)
    assert len(body) + 2 > MAX_MARKER_CHARS
    assert refs(f"[{body}]") == ((), ())


@pytest.mark.parametrize(
    ("text", "cleaned"),
    [
        ("Foo [1][99].", "Foo [1]."),
        ("Foo [1, 99].", "Foo [1]."),
        ("Foo [99].", "Foo ."),
        ("[99]", ""),
        ("Foo [2-9].", "Foo [2-3]."),
        ("Foo [0, 1-2, 7].", "Foo [1-2]."),
        ("Foo 【1、9】.", "Foo 【1】."),
        ("Valid stays as written: [3-1] [1,2].", "Valid stays as written: [3-1] [1,2]."),
        ("In code `[99]` it stays.", "In code `[99]` it stays."),
    ],
)
def test_strip_invalid(text: str, cleaned: str) -> None:
    result = extract(text, 3, strip_invalid=True)
    assert result.text == cleaned
    assert extract(text, 3).text == text


@pytest.mark.parametrize(
    "text",
    [
        "[[99]1]",  # would become "[1]"
        "[1, [99]2]",  # would become "[1, 2]"
        "[1]【99】(x)",  # would turn [1] into link text
        "``[99]`",  # would merge into a fence-like run
        "[99]```py",  # would open a code fence
        "  [99] ~~~",  # would open a code fence
        "\\【99】[1]",  # would escape the bracket of [1]
    ],
)
def test_strip_keeps_markers_whose_removal_would_change_the_text(text: str) -> None:
    result = extract(text, 3, strip_invalid=True)
    assert result.text == text
    assert result.invalid_indices == (99,)


def test_markers_locate_output_and_input() -> None:
    result = extract("A [9] b [1, 9] c [2]", 3, strip_invalid=True)
    assert result.text == "A  b [1] c [2]"
    spots = [(m.start, m.end, m.text, m.indices, m.invalid) for m in result.markers]
    assert spots == [
        (2, 2, "", (), (9,)),
        (5, 8, "[1]", (1,), (9,)),
        (11, 14, "[2]", (2,), ()),
    ]
    assert [(m.source_start, m.source_end) for m in result.markers] == [(2, 5), (8, 14), (17, 20)]


def test_negative_source_count_is_rejected() -> None:
    with pytest.raises(ValueError):
        extract("[1]", -1)
