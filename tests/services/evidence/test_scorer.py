"""The hand-written checks of the support scorer."""

import pytest

from services.citations import SupportVerdict
from services.evidence.scorer import (
    CALIBRATION,
    features,
    is_claim,
    names,
    numbers,
    stem,
    support_score,
    verdict_for,
)

PASSAGE = "Tokens expire after 30 days unless they are renewed by the Owner."


def test_light_stemming_meets_inflections() -> None:
    assert stem("licensed") == stem("licenses") == stem("license")
    assert stem("renewing") == stem("renewed")


def test_numbers_in_digits_and_words() -> None:
    assert numbers("It takes 30 days, or 1,000 requests, twice.") == {"30", "1000", "2"}


def test_a_changed_number_is_unsupported_whatever_the_cosine() -> None:
    f = features("Tokens expire after 60 days unless renewed by the Owner.", PASSAGE, 1.0)
    assert f.number_changed
    assert verdict_for(support_score(f)) == SupportVerdict.UNSUPPORTED


def test_a_copied_sentence_is_supported() -> None:
    f = features("Tokens expire after 30 days unless renewed by the Owner.", PASSAGE, 0.95)
    assert not (f.number_changed or f.negation_mismatch or f.missing_names)
    assert verdict_for(support_score(f)) == SupportVerdict.SUPPORTED


def test_negation_of_a_shared_word_is_a_mismatch() -> None:
    f = features("Tokens do not expire after 30 days.", PASSAGE, 0.9)
    assert f.negation_mismatch
    unrelated = features(
        "Tokens expire after 30 days.", "No refund. Tokens expire after 30 days.", 0.9
    )
    assert not unrelated.negation_mismatch


def test_a_name_missing_from_the_quote_is_counted() -> None:
    assert "python-decouple" in names("Use python-decouple to read .env files.")
    f = features("The Admin renews tokens every 30 days.", PASSAGE, 0.9)
    assert f.missing_names == 1


def test_an_antonym_is_caught() -> None:
    f = features("Tokens expire before 30 days.", "Tokens expire after 30 days.", 0.95)
    assert f.antonym


def test_scores_stay_in_the_unit_interval() -> None:
    for cosine in (-1.0, 0.0, 0.5, 1.0):
        f = features("Completely different words here today.", PASSAGE, cosine)
        assert 0.0 <= support_score(f, CALIBRATION) <= 1.0


@pytest.mark.parametrize(
    "sentence",
    [
        "Hello!",
        "Thanks for asking.",
        "Do you want to know more?",
        "The documents do not say how much a ticket costs.",
        "I could not find that in the sources.",
        "Here is what I found:",
        "x = capitals[1]",
        "print(load_dotenv())",
        "| Paris | France |",
        "```python",
    ],
)
def test_what_is_not_a_claim(sentence: str) -> None:
    assert not is_claim(sentence)


@pytest.mark.parametrize(
    "sentence", ["Tokens expire after 30 days.", "The Eiffel Tower was moved to Lyon in 1999."]
)
def test_statements_are_claims(sentence: str) -> None:
    assert is_claim(sentence)
