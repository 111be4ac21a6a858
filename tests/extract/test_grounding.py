"""Source grounding (structgen.grounding) and its place in per-leaf confidence."""

from __future__ import annotations

import pytest

from structgen.extract.confidence import leaf_confidence, rank
from structgen.grounding import Source, normalize


@pytest.mark.parametrize(("value", "source", "expected"), [
    ("Ada Lovelace", "Contact: ADA   lovelace, London", True),
    ("ada lovelace.", "Contact: Ada Lovelace, London", True),  # surrounding punctuation ignored
    ("Ada Byron", "Contact: Ada Lovelace, London", False),
    ("Ｌｏｎｄｏｎ", "based in London", True),  # NFKC: full-width letters
    ("北京", "会议在北京举行。", True),
    ("上海", "会议在北京举行。", False),
    (36, "Ada is 36 years old.", True),
    (3, "Ada is 36 years old.", False),  # not a digit run's part
    (36.0, "Ada is 36 years old.", True),
    (12.5, "costs 12.50 EUR", True),  # by value
    (12.5, "costs 12.5 EUR", True),
    (-4, "down 4 degrees", True),
    (float("inf"), "inf", False),
    (1200, "a total of 1,200 EUR", True),  # digit groups read as one number
    (1200, "a total of 1 200 EUR", True),
    (200, "a total of 1,200 EUR", False),
    (0.05, "a rate of 0.05", True),
    (5, "a rate of 0.05", False),
    (1e-9, "charges of 1e-9 and 2e-9", True),  # scientific notation, by value
    (2e-9, "charges of 1E-9 and 2.0e-9", True),
    (2.5e-10, "a gap of 2.5e-10 m", True),  # small values are not rounded away
    (1e-10, "a gap of 2.5e-10 m", False),
    (9, "charges of 1e-9", False),  # an exponent is not a number of its own
    (0.5, "half-life of .5 s", True),
    (0, "assuming initial velocity is zero", True),  # number words
    (12, "a dozen eggs", True),
    (3, "three apples", True),
    (3, "threefold", False),  # a whole word only
    (1, "someone", False),
    (True, "true", None),
    (None, "null", None),
    ("", "anything", None),
    ("...", "anything", None),
])
def test_grounded(value: object, source: str, expected: bool | None) -> None:
    assert Source(source).grounded(value) is expected


def test_normalize() -> None:
    assert normalize("A\t\tB\n C") == "a b c"
    assert normalize("ﬁne Straße") == "fine strasse"


def test_leaf_confidence_with_source() -> None:
    text = '{"name": "Ada", "city": "Paris", "age": 36, "ok": true, "tags": ["x", null]}'
    spans = [(0, len(text), -0.5)]
    conf = leaf_confidence(text, spans, source="Ada, 36, lives in Rome.")
    assert {k: c.get("grounded") for k, c in conf.items()} == {
        "$.name": True, "$.city": False, "$.age": True, "$.ok": None, "$.tags[0]": False, "$.tags[1]": None}
    assert all(c["mean"] == c["min"] == -0.5 for c in conf.values())
    assert all("grounded" not in c for c in leaf_confidence(text, spans).values())
    # a leaf cut short is not judged
    cut = leaf_confidence('{"name": "Ad', [(0, 12, -0.1)], source="Ada")
    assert "grounded" not in cut["$.name"]


def test_rank_orders_ungrounded_last() -> None:
    entries = [{"mean": -0.1, "grounded": False}, {"mean": -2.0, "grounded": True}, {"mean": -1.0},
               {"mean": -0.01, "grounded": False}]
    order = sorted(entries, key=rank, reverse=True)
    assert order == [entries[2], entries[1], entries[3], entries[0]]


def test_rank_orders_repeated_list_values_below_all_others() -> None:
    entries = [{"mean": -0.01, "grounded": True, "repeated": True}, {"mean": -3.0, "grounded": False},
               {"mean": -2.0, "repeated": False}, {"mean": -0.5, "grounded": False, "repeated": True}]
    order = sorted(entries, key=rank, reverse=True)
    assert order == [entries[2], entries[1], entries[0], entries[3]]
