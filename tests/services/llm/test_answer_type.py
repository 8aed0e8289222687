"""Answer types: a question that asks for a quantity is answered with one, or not at all."""

from __future__ import annotations

import pytest

from services.llm.answer_type import Expected, Kind, expected_answer, unknown_names


@pytest.mark.parametrize(
    ("question", "expected"),
    [
        ("How many days do I have to cure the violation?", Expected(Kind.UNIT, "day")),
        ("For how many years must the offer stay valid?", Expected(Kind.UNIT, "year")),
        ("How many UIDs should a container get?", Expected(Kind.NUMBER)),
        ("How much memory does deflateInit() allocate?", Expected(Kind.SIZE)),
        ("How much disk quota does a home directory get?", Expected(Kind.SIZE)),
        ("How long must the written offer stay valid?", Expected(Kind.LENGTH)),
        ("How large are the header and the trailer?", Expected(Kind.SIZE)),
        ("What buffer size does the example recommend?", Expected(Kind.SIZE)),
        ("Which version of the specification is this?", Expected(Kind.VERSION)),
        ("What is the minimum Python version it supports?", Expected(Kind.VERSION)),
        ("Which PostgreSQL version does the database need?", Expected(Kind.VERSION)),
        ("Which version introduced the treemagic element?", Expected(Kind.VERSION, change=True)),
        ("What is the largest windowBits value it accepts?", Expected(Kind.NUMBER)),
        ("What numeric UID does www-data have?", Expected(Kind.NUMBER)),
        ("How many mantissa bits does a 32-bit float have?", Expected(Kind.UNIT, "bit")),
        ("How many annual leave days do I get?", Expected(Kind.UNIT, "day")),
        ("How many users can log in at once?", Expected(Kind.NUMBER)),
        (
            "Which Python 3 version is the default?",
            Expected(Kind.VERSION, given=frozenset({"python 3"})),
        ),
        ("Which range of UIDs does adduser hand out?", Expected(Kind.NUMBER)),
        # Not quantities: a manner, a definition, a name, a yes or no.
        ("How much can I charge for the source code?", None),
        ("How do I turn off the cache?", None),
        ("What value does dotenv_values give a bare FOO line?", None),
        ("What UID did the operator account have?", None),
        ("Who is the license steward?", None),
        ("Is sublicensing permitted?", None),
        ("How can I find out the highest system UID?", None),
    ],
)
def test_what_a_question_asks_for(question: str, expected: Expected | None) -> None:
    assert expected_answer(question) == expected


@pytest.mark.parametrize(
    ("kind", "sentence", "met"),
    [
        (Expected(Kind.UNIT, "day"), "You have 30 days after the notice.", True),
        (Expected(Kind.UNIT, "day"), "You have thirty days after the notice.", True),
        (Expected(Kind.UNIT, "day"), "The offer is valid for three years.", False),
        (Expected(Kind.UNIT, "day"), "You must cure the violation promptly.", False),
        (Expected(Kind.NUMBER), "Applications may use deflateInit2() instead.", False),
        (Expected(Kind.NUMBER), "It allocates 65536 UIDs per container.", True),
        (Expected(Kind.NUMBER), "No grants are made (see Section 10.2).", False),
        (Expected(Kind.SIZE), "It allocates on the order of 256K bytes.", True),
        (Expected(Kind.SIZE), "Each container is given 64K UIDs.", False),
        (Expected(Kind.SIZE), "Reads go through a 64K buffer; files of 16KB or 2 GiB.", True),
        (Expected(Kind.SIZE), "The table holds 10M rows.", False),
        (Expected(Kind.SIZE), "The limit is 100K in all.", True),
        (Expected(Kind.SIZE), "The header is only two bytes, the trailer four-byte.", True),
        (Expected(Kind.SIZE), "pip cache info shows the total size of the cache.", False),
        (Expected(Kind.SIZE), "It needs at least ASN1_MAX_ERROR_DESCRIPTION_SIZE bytes.", True),
        (Expected(Kind.SIZE), "Pass error_description_size bytes.", False),
        (Expected(Kind.LENGTH), "It stays valid for at least three years.", True),
        (Expected(Kind.LENGTH), "It stays valid for as long as you offer spare parts.", True),
        (Expected(Kind.LENGTH), "The rights terminate automatically if you fail to comply.", False),
        (Expected(Kind.LENGTH), "Indexing takes a few seconds per document.", True),
        (Expected(Kind.SIZE), "There is no limit on the size of the cache.", True),
        (Expected(Kind.VERSION), "This is version 0.21 of the specification.", True),
        (Expected(Kind.VERSION), "You may choose any version ever published.", True),
        (Expected(Kind.VERSION), "Point the URL at PostgreSQL 16 or newer.", True),
        (Expected(Kind.VERSION, change=True), "This is version 0.21 of the spec.", False),
        (Expected(Kind.VERSION, change=True), "The element was added in version 0.13.", True),
        (Expected(Kind.VERSION), "Once you have Rust 1.29 installed, run it.", True),
        (Expected(Kind.VERSION), "The rules are in Section 4 of the License.", False),
        (Expected(Kind.VERSION), "It needs at least 3 workers to start.", False),
        (Expected(Kind.VERSION), "Set `PYTHON_DOTENV_DISABLED=1` to disable it.", False),
        (Expected(Kind.VERSION), "The default is Python 3.11 on bookworm.", True),
        # A version the question names itself does not say which.
        (Expected(Kind.VERSION, given=frozenset({"python 3"})), "It needs Python 3.", False),
        (Expected(Kind.VERSION, given=frozenset({"python 3"})), "It ships Python 3.11.", True),
    ],
)
def test_whether_a_sentence_states_the_quantity(kind: Expected, sentence: str, met: bool) -> None:
    assert kind.met_by(sentence) is met


def test_code_names_the_sources_never_use_are_reported() -> None:
    texts = ["Advanced applications may use deflateInit2() here.", "Call load_dotenv() first."]
    question = "What is the largest windowBits value that deflateInit2() accepts with load_dotenv?"
    assert unknown_names(question, texts) == ["windowBits"]
    assert unknown_names("How do I install Clippy on macOS?", texts) == []
