"""The extractive generator: statements, ranking by meaning and words, abstention, determinism."""

from __future__ import annotations

import dataclasses
import re

import pytest

from services.citations import CitationSource, SourceLocation
from services.llm.base import GenerationRequest, Retrieval
from services.llm.extractive import (
    MAX_ANSWER_CHARS,
    MAX_SENTENCES,
    NOTHING_FOUND,
    ExtractiveGenerator,
    SentenceVectors,
    compose,
    terms,
)
from services.llm.sentences import is_statement, statements_of
from services.retrieval.embeddings import create_embedder

# Excerpts of real texts: the Apache License 2.0, the GPL 3, and Clippy's README.
APACHE_WARRANTY = """7. Disclaimer of Warranty. Unless required by applicable law or
      agreed to in writing, Licensor provides the Work (and each
      Contributor provides its Contributions) on an "AS IS" BASIS,
      WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or
      implied, including, without limitation, any warranties or conditions
      of TITLE, NON-INFRINGEMENT, MERCHANTABILITY, or FITNESS FOR A
      PARTICULAR PURPOSE. You are solely responsible for determining the
      appropriateness of using or redistributing the Work and assume any
      risks associated with Your exercise of permissions under this License.

   8. Limitation of Liability. In no event and under no legal theory,"""
GPL_TERMINATION = """them to use, propagate and modify the work.

  8. Termination.

  You may not propagate or modify a covered work except as expressly
provided under this License.  Any attempt otherwise to propagate or
modify it is void, and will automatically terminate your rights under
this License (including any patent licenses granted under the third
paragraph of section 11).

  However, if you cease all violation of this License, then your
license from a particular copyright holder is reinstated (a)
provisionally, unless and until the copyright holder explicitly and
finally terminates your license, and (b) permanently, if the copyright
holder fails to notify you of the violation by some reasonable means
prior to 60 days after the cessation."""
CLIPPY = """#### Step 2: Install Clippy

Once you have rustup and the latest stable release (at least Rust 1.29) installed, run the
following command:

```terminal
rustup component add clippy
```

If it says that it can't find the `clippy` component, please run `rustup self update`.

| Category              | Description                              | Default level |
|-----------------------|------------------------------------------|---------------|
| `clippy::correctness` | code that is outright wrong or useless   | **deny**      |
"""
KITCHEN = "# Kitchen\n\nThe espresso machine is descaled every Friday. Oat milk is on the shelf.\n"


@pytest.fixture(scope="module")
def embedder():
    return create_embedder()


def source(index: int, name: str) -> CitationSource:
    return CitationSource(
        index=index,
        chunk_id=f"c{index}",
        chunk_index=0,
        document_id=f"d-{name}",
        document_name=name,
        content_type="text/plain",
        location=SourceLocation(),
        excerpt="",
        score=0.5,
    )


def request(question: str, *docs: tuple[str, str], citations: bool = True) -> GenerationRequest:
    return GenerationRequest(
        messages=(),
        sources=[source(i, name) for i, (name, _) in enumerate(docs, start=1)],
        source_texts=[text for _, text in docs],
        question=question,
        citations=citations,
    )


def cited(answer: str) -> list[int]:
    return [int(n) for n in re.findall(r"\[(\d+)\]", answer)]


def test_statements_skip_headings_tables_fragments_and_cut_clauses() -> None:
    texts = [s.text for s in statements_of(GPL_TERMINATION)]
    assert texts[0].startswith("You may not propagate or modify a covered work")
    # The chunk opens mid-sentence ("them to use, ..."); "8. Termination." is a heading.
    assert not any(t.startswith(("them", "Termination", "8.")) for t in texts)
    # One sentence, though nupunkt splits "(a) provisionally" and "(b) permanently" apart.
    assert any(t.startswith("However, if you cease") and t.endswith("cessation.") for t in texts)
    clippy = [s.text for s in statements_of(CLIPPY)]
    assert not any("clippy::correctness" in t or "Default level" in t for t in clippy)
    assert not any(t.endswith(":") for t in clippy)
    # The block that ends the apache chunk mid-sentence gives no statement.
    assert not any("In no event" in s.text for s in statements_of(APACHE_WARRANTY))


def test_a_command_stays_with_the_sentence_that_introduces_it() -> None:
    [command] = [s for s in statements_of(CLIPPY) if s.code]
    assert command.text.endswith("run the following command: `rustup component add clippy`")
    assert "Install Clippy" in command.match_text


def test_legal_abbreviations_and_numbering_do_not_split_sentences() -> None:
    text = (
        '1.1. "Contributor" means each individual or legal entity that creates Covered '
        "Software, see Sec. 3 and 17 U.S.C. § 101 et seq. for details. The Work (e.g. a "
        "library) is covered [7]."
    )
    assert [s.text for s in statements_of(text)] == [
        '"Contributor" means each individual or legal entity that creates Covered Software, '
        "see Sec. 3 and 17 U.S.C. § 101 et seq. for details.",
        "The Work (e.g. a library) is covered (7).",
    ]


@pytest.mark.parametrize(
    ("sentence", "expected"),
    [
        ("TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION.", False),
        ("APPENDIX: How to apply the Apache License to your work.", False),
        ("What is the Apache License?", False),
        ("How To Apply These Terms To Your New Programs.", False),
        ("Run the following command:", False),
        ("Unused days expire at the end of March.", True),
    ],
)
def test_what_reads_as_a_statement(sentence: str, expected: bool) -> None:
    assert is_statement(sentence) is expected


def test_light_stemming_meets_plural_and_singular() -> None:
    assert set(terms("warranties")) == set(terms("Warranty"))
    answer = compose(request("Is there a warranty?", ("apache.txt", APACHE_WARRANTY)))
    assert cited(answer) == [1] and "WITHOUT WARRANTIES" in answer


def test_the_answering_document_comes_first_and_alone(embedder) -> None:
    req = request(
        "When does the license terminate?",
        ("kitchen.md", KITCHEN),
        ("apache.txt", APACHE_WARRANTY),
        ("gpl-3.txt", GPL_TERMINATION),
    )
    answer = compose(req, embedder)
    first = answer.split(" [")[0]
    assert "terminate" in first and first in GPL_TERMINATION.replace("\n", " ").replace("  ", " ")
    assert set(cited(answer)) == {3}, answer


def test_an_install_question_gets_the_command(embedder) -> None:
    answer = compose(
        request("How do I install Clippy?", ("gpl-3.txt", GPL_TERMINATION), ("clippy.md", CLIPPY)),
        embedder,
    )
    assert "`rustup component add clippy` [2]." in answer
    assert answer.index("rustup component add clippy") < 200


@pytest.mark.parametrize(
    "question",
    [
        "What is the capital of Australia?",
        "How many vacation days do employees get per year?",
        "What is the maximum file size for uploads?",
    ],
)
def test_weak_evidence_answers_that_the_documents_do_not_say(embedder, question) -> None:
    docs = (("apache.txt", APACHE_WARRANTY), ("gpl-3.txt", GPL_TERMINATION), ("clippy.md", CLIPPY))
    assert compose(request(question, *docs), embedder) == NOTHING_FOUND
    assert compose(request(question, *docs)) == NOTHING_FOUND


def test_length_is_capped(embedder) -> None:
    long = " ".join(
        f"Clause {n} says the licence terminates on breach number {n}." for n in range(30)
    )
    answer = compose(request("When does the licence terminate?", ("long.txt", long)), embedder)
    assert 1 <= len(cited(answer)) <= MAX_SENTENCES
    assert len(answer) <= MAX_ANSWER_CHARS + 20 * MAX_SENTENCES


def test_without_citations_there_are_no_markers(embedder) -> None:
    req = request("Is there a warranty?", ("apache.txt", APACHE_WARRANTY), citations=False)
    answer = compose(req, embedder)
    assert "WITHOUT WARRANTIES" in answer and "[" not in answer


def test_markers_inside_documents_never_become_citations(embedder) -> None:
    text = "The espresso machine is descaled every Friday [7]. See also [1][2] and 【3】."
    answer = compose(request("When is the espresso machine descaled?", ("k.md", text)), embedder)
    assert cited(answer) == [1]
    assert "Friday (7) [1]." in answer


async def test_the_same_question_gives_the_same_answer(embedder) -> None:
    docs = (("kitchen.md", KITCHEN), ("apache.txt", APACHE_WARRANTY), ("clippy.md", CLIPPY))
    req = request("What does the license say about warranties?", *docs)
    answers = set()
    for _ in range(3):
        generator = ExtractiveGenerator(embedder)
        answers.add("".join([e.text async for e in generator.generate(req) if hasattr(e, "text")]))
    [answer] = answers
    assert set(cited(answer)) == {2}


def test_greeting_and_disabled_retrieval_are_not_answers() -> None:
    gated = GenerationRequest(messages=(), question="Hi!", retrieval=Retrieval.GATED)
    assert "[" not in compose(gated) and compose(gated) != NOTHING_FOUND


def test_list_items_of_legal_text_are_statements() -> None:
    text = (
        "You may reproduce and distribute copies of the Work provided that You meet the "
        "following conditions:\n\n      (a) You must give any other recipients of the Work or\n"
        "          Derivative Works a copy of this License; and\n\n"
        "      (b) You must cause any modified files to carry prominent notices; and\n"
    )
    texts = [s.text for s in statements_of(text)]
    assert texts == [
        "You must give any other recipients of the Work or Derivative Works a copy of this "
        "License.",
        "You must cause any modified files to carry prominent notices.",
    ]


def test_another_document_joins_for_the_part_of_the_question_it_answers(embedder) -> None:
    travel = (
        "## Per diem\n\nEmployees receive a per diem of 45 EUR for each full day of travel, and "
        "25 EUR for the day of departure and the day of return.\n"
    )
    expenses = (
        "Approval\n\nYour manager approves claims up to 1,000 EUR. Claims above 1,000 EUR also "
        "need the approval of the finance team, which answers within five working days.\n"
    )
    answer = compose(
        request(
            "How much is the per diem on the day of departure, and who approves a 1,500 EUR claim?",
            ("travel.md", travel),
            ("kitchen.md", KITCHEN),
            ("expenses.html", expenses),
        ),
        embedder,
    )
    assert answer.startswith("Employees receive a per diem"), answer
    assert set(cited(answer)) == {1, 3} and "finance team" in answer


GPL_CURE = """  Moreover, your license from a particular copyright holder is
reinstated permanently if the copyright holder notifies you of the
violation by some reasonable means, this is the first time you have
received notice of violation of this License (for any work) from that
copyright holder, and you cure the violation prior to 30 days after
your receipt of the notice."""
APACHE_PATENT = """3. Grant of Patent License. If You institute patent litigation against any
entity alleging that the Work constitutes patent infringement, then any patent licenses
granted to You under this License for that Work shall terminate as of the date such
litigation is filed. The rights granted under this License terminate automatically if You
breach its terms."""


@pytest.mark.parametrize(
    ("question", "names"),
    [
        # Asks for a number of days; the one source on the subject states none.
        ("How many days does a licensee have before the patent license terminates?", 1),
        # Names the Apache License; only the GPL states a time to cure.
        ("How long does a licensee have to cure a breach before the Apache License ends?", 2),
        # Asks about a name that no source uses.
        ("Does the patent licence terminate when patentFiling is set?", 2),
    ],
)
def test_a_source_on_the_subject_that_does_not_say_is_not_an_answer(
    embedder, question: str, names: int
) -> None:
    docs = [("apache-2.0.txt", APACHE_PATENT), ("gpl-3.0.txt", GPL_CURE)][:names]
    assert compose(request(question, *docs), embedder) == NOTHING_FOUND


def test_a_file_extension_in_the_question_does_not_name_a_document(embedder) -> None:
    question = "When does the patent license end for a project shipped as a txt file?"
    docs = [("apache-notes.md", APACHE_PATENT), ("gpl-3.0.txt", GPL_CURE)]
    assert cited(compose(request(question, *docs), embedder)) == [1]


def test_a_quantity_question_is_answered_with_the_sentence_that_states_it(embedder) -> None:
    question = "How many days do I have to cure a GPL violation after the notice?"
    answer = compose(
        request(question, ("apache-2.0.txt", APACHE_PATENT), ("gpl-3.0.txt", GPL_CURE)),
        embedder,
    )
    assert cited(answer) == [2]
    assert "prior to 30 days after your receipt of the notice" in answer


def test_admonitions_are_prose_and_lower_case_names_may_open_a_paragraph() -> None:
    text = (
        "## Disabling caching\n\n"
        "pip's caching behaviour is disabled by passing the `--no-cache-dir` option.\n\n"
        "```{caution}\n:class: margin\nThe exact structure of the cache is an implementation "
        "detail and may change.\n```\n\n"
        "````{tab} Linux\n```\n~/.cache/pip\n```\n````\n\n"
        "Developers protect your rights with two steps:\n"
        "(1) assert copyright on the software, and (2) offer you this License.\n"
    )
    texts = [s.text for s in statements_of(text)]
    assert texts[0] == "pip's caching behaviour is disabled by passing the `--no-cache-dir` option."
    assert "The exact structure of the cache is an implementation detail and may change." in texts
    assert not any(":class:" in t or "```" in t for t in texts)
    # A list item continues the sentence before it: not a statement of its own.
    assert not any(t.startswith("assert copyright") for t in texts)


class CountingEmbedder:
    """The real embedder, counting the texts it is asked to embed."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.documents: list[str] = []
        self.queries: list[str] = []

    def embed_documents(self, texts):
        self.documents.extend(texts)
        return self.inner.embed_documents(texts)

    def embed_query(self, text):
        self.queries.append(text)
        return self.inner.embed_query(text)


async def answer_of(generator: ExtractiveGenerator, req: GenerationRequest) -> str:
    return "".join([e.text async for e in generator.generate(req) if hasattr(e, "text")])


async def test_sentences_are_embedded_once_and_the_answer_stays_the_same(embedder) -> None:
    docs = (("kitchen.md", KITCHEN), ("apache.txt", APACHE_WARRANTY), ("gpl.txt", GPL_TERMINATION))
    req = request("What does the license say about warranties?", *docs)
    counting = CountingEmbedder(embedder)
    generator = ExtractiveGenerator(counting)
    first = await answer_of(generator, req)
    embedded = len(counting.documents)
    assert embedded > 3
    assert len(set(counting.documents)) == embedded  # no sentence twice in one answer
    again = await answer_of(generator, req)
    assert again == first == await answer_of(ExtractiveGenerator(embedder), req)
    assert len(counting.documents) == embedded  # the second answer embedded no sentence


async def test_the_question_vector_from_retrieval_is_used_as_it_is(embedder) -> None:
    docs = (("kitchen.md", KITCHEN), ("apache.txt", APACHE_WARRANTY))
    question = "What does the license say about warranties?"
    counting = CountingEmbedder(embedder)
    generator = ExtractiveGenerator(counting)
    plain = await answer_of(generator, request(question, *docs))
    assert counting.queries == [question]
    given = dataclasses.replace(
        request(question, *docs), question_vector=embedder.embed_query(question)
    )
    assert await answer_of(generator, given) == plain
    assert counting.queries == [question]  # not embedded again


def test_the_sentence_cache_keeps_the_most_recently_used(embedder) -> None:
    counting = CountingEmbedder(embedder)
    vectors = SentenceVectors(counting, size=2)
    [oat] = vectors.embed_documents(["Oat milk is on the shelf."])
    vectors.embed_documents(["The machine is descaled on Fridays."])
    vectors.embed_documents(["Oat milk is on the shelf."])  # kept, and now the most recent
    vectors.embed_documents(["Tea is in the cupboard."])  # the descaling sentence goes
    assert counting.documents == [
        "Oat milk is on the shelf.",
        "The machine is descaled on Fridays.",
        "Tea is in the cupboard.",
    ]
    assert list(oat) == embedder.embed_documents(["Oat milk is on the shelf."])[0]
    vectors.embed_documents(["Oat milk is on the shelf.", "The machine is descaled on Fridays."])
    assert counting.documents[3:] == ["The machine is descaled on Fridays."]
