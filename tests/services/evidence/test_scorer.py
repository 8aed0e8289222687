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


def test_rare_words_weigh_more_in_coverage() -> None:
    quote = "The daemon uses the socket."
    rare_missing = features("The daemon uses the zeroconf socket.", quote, 0.9)
    common_missing = features("The daemon uses the same socket.", quote, 0.9)
    plain_missing = features("The daemon uses the new socket.", quote, 0.9)
    assert common_missing.coverage == 1.0  # "same" is a stop word
    assert rare_missing.coverage < plain_missing.coverage < 1.0


def test_a_swapped_name_in_a_covered_clause_is_unsupported() -> None:
    quote = "python-dotenv reads key-value pairs from a `.env` file."
    f = features("python-decouple reads key-value pairs from a .env file.", quote, 0.95)
    assert f.name_swap and not f.added_name
    assert verdict_for(support_score(f)) == SupportVerdict.UNSUPPORTED
    same = features("python-dotenv reads key-value pairs from a .env file.", quote, 0.95)
    assert not same.name_swap
    assert verdict_for(support_score(same)) == SupportVerdict.SUPPORTED


def test_a_name_in_the_document_name_or_an_acronym_is_not_missing() -> None:
    quote = "This License applies to the Work, and the GNU Lesser General Public License too."
    f = features(
        "Under the Apache License, the LGPL applies.", quote, 0.9, context="apache-2.0.txt"
    )
    assert f.missing_names == 0


def test_an_added_clause_makes_the_verdict_partial() -> None:
    f = features(
        "Tokens expire after 30 days unless they are renewed by the Owner, "
        "and each renewal is billed to the customer's invoice monthly.",
        PASSAGE,
        0.8,
    )
    assert len(f.clause_coverage) == 2
    assert max(f.clause_coverage) == 1.0 and min(f.clause_coverage) < 0.2
    assert verdict_for(support_score(f)) == SupportVerdict.PARTIAL


def test_a_number_in_an_added_clause_is_new_not_changed() -> None:
    f = features(
        "Tokens expire after 30 days unless they are renewed by the Owner, "
        "and the billing department sends 3 reminder letters.",
        PASSAGE,
        0.8,
    )
    assert not f.number_changed
    assert verdict_for(support_score(f)) == SupportVerdict.PARTIAL


def test_a_negation_in_the_next_sentence_still_counts() -> None:
    quote = "The contents of the NOTICE file are for informational purposes."
    around = f"{quote} They do not modify the License."
    claim = "The contents of the NOTICE file modify the License."
    assert not features(claim, quote, 0.9).negation_mismatch
    f = features(claim, quote, 0.9, around=around)
    assert f.negation_mismatch
    assert verdict_for(support_score(f)) == SupportVerdict.UNSUPPORTED


def test_fails_to_and_does_not_agree() -> None:
    f = features(
        "The license is restored if the holder does not notify you within 60 days.",
        "The license is restored if the holder fails to notify you within 60 days.",
        0.9,
    )
    assert not f.negation_mismatch and not f.polarity_mismatch


def test_a_negating_prefix_is_an_antonym() -> None:
    f = features(
        "Applications must match globs case-sensitively.",
        "Applications MUST match globs case-insensitively.",
        0.95,
    )
    assert f.antonym
    assert verdict_for(support_score(f)) == SupportVerdict.UNSUPPORTED


def test_the_score_never_falls_as_the_cosine_rises() -> None:
    # The builder skips embeddings on this property: the verdict at cosine -1 and 1 bounds it.
    claims = [
        "Tokens expire after 30 days unless renewed by the Owner.",
        "Tokens do not expire.",
        "The Admin renews tokens, and the billing team sends invoices each month.",
        "Tokens expire after 60 days.",
    ]
    for claim in claims:
        scores = [support_score(features(claim, PASSAGE, c / 10)) for c in range(-10, 11)]
        assert scores == sorted(scores)


@pytest.mark.parametrize(
    ("claim", "passage"),
    [
        # The passage uses the word both ways; the claim uses it as the passage's other use.
        (
            "When your rights are terminated, people who received copies keep their licenses.",
            "Termination of your rights does not terminate the licenses of parties who have "
            "received copies from you.",
        ),
        # A negating prefix on one side, a negation on the other.
        (
            "Subsystems such as NFS map users they cannot map to the overflow UID.",
            "The overflow UID is where subsystems such as NFS map unmappable users to.",
        ),
        # "unless" bounds the passage's negation as "without" bounds the claim's.
        (
            "Turning off the cache without a higher-level cache makes pip slower.",
            "Do not disable the cache unless you have caching at a higher level: "
            "disabling it makes pip slower.",
        ),
        # None is a value here, not a negation.
        (
            "A variable without a value maps to None in dotenv_values.",
            "A variable without a value maps to `None` in `dotenv_values`.",
        ),
    ],
)
def test_paraphrases_that_are_not_negation_mismatches(claim: str, passage: str) -> None:
    assert not features(claim, passage, 0.8).negation_mismatch


@pytest.mark.parametrize(
    ("claim", "passage"),
    [
        # The passage uses "behalf" as it stands too, but negates it next to what the claim
        # puts there.
        (
            "You may offer warranty obligations on behalf of the Contributors.",
            "You may offer warranty obligations only on Your own behalf, and not on behalf of "
            "any Contributor.",
        ),
        # A plain use inside code does not count: `override=False` is not "override".
        (
            "By default, load_dotenv() overrides existing environment variables.",
            "By default, load_dotenv() will not override existing environment variables "
            "(`override=False`).",
        ),
        # The plain use sits in another sentence of the passage.
        (
            "Web content should be owned by www-data.",
            "Web content should not be owned by this user. Data written by web servers will "
            "be owned by www-data.",
        ),
    ],
)
def test_negations_that_plain_uses_elsewhere_do_not_excuse(claim: str, passage: str) -> None:
    assert features(claim, passage, 0.9).negation_mismatch


def test_plural_and_dotted_names_are_found_in_their_other_forms() -> None:
    passage = "Daemons should run under individual UID/GIDs. It doesn't touch the environment."
    f = features("Daemons run under their own UIDs and leave os.environ alone.", passage, 0.8)
    assert f.missing_names == 0
    assert features("Daemons run under sys.path UIDs.", passage, 0.8).missing_names == 1


def test_a_close_word_counts_in_part_and_an_unrelated_one_not_at_all() -> None:
    from services.evidence.scorer import _weighted

    assert _weighted({"price": "price"}, {"price": "price"}) == 1.0
    assert 0.5 <= _weighted({"cost": "cost"}, {"price": "price"}) < 1.0
    assert _weighted({"licenc": "licence"}, {"licens": "license"}) >= 0.5  # a spelling
    assert _weighted({"paint": "paint"}, {"price": "price"}) == 0.0
    assert _weighted({"cost": "cost"}, {}) == 0.0


def test_a_dash_ends_what_a_negation_reaches() -> None:
    claim = "systemd does not require system users to be resolvable without network access."
    passage = (
        "systemd requires that system users are resolvable without network — a requirement "
        "that is not made for regular users."
    )
    assert features(claim, passage, 0.9).negation_mismatch


@pytest.mark.parametrize(
    ("claim", "passage", "context", "swapped"),
    [
        ("The Free Software Foundation is the license steward.",
         "Mozilla Foundation is the license steward.", "", True),
        ("Secondary License includes the Apache License, Version 2.0.",
         '"Secondary License" means the GNU General Public License, Version 2.0.', "", True),
        # The name is the document's own: the passage says "this License".
        ("The Apache License grants a patent license.",
         "Each Contributor grants You a patent license under this License.",
         "apache-2.0.txt Apache License", False),
        # Same name, other words around it.
        ("The Mozilla Foundation stewards the license.",
         "Mozilla Foundation is the license steward.", "", False),
    ],
)  # fmt: skip
def test_a_proper_name_with_another_names_head_is_a_swap(
    claim: str, passage: str, context: str, swapped: bool
) -> None:
    assert features(claim, passage, 0.9, context=context).name_swap is swapped
