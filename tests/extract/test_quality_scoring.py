"""bench/extract_quality.py's scoring: leaves by path, normalised comparison, AUC."""

from __future__ import annotations

import math

from bench.extract_quality import auc, first_json, leaves, score


def test_leaves_by_path_nulls_absent() -> None:
    assert leaves({"a": 1, "b": {"c": [True, None, "x"]}, "d": None, "e": []}) == {
        "$.a": 1, "$.b.c[0]": True, "$.b.c[2]": "x"}


def test_score_normalises_strings_and_numbers() -> None:
    gold = {"title": "Spirited Away", "score": 8.6, "n": 92, "ok": True, "tags": ["a", "b"]}
    pred = {"title": "  spirited  away. ", "score": 8.60, "n": "92", "ok": "true", "tags": ["a"], "extra": 1}
    tp, npred, ngold, right = score(pred, gold)
    assert (npred, ngold) == (6, 6)
    assert right == {"$.title": True, "$.score": True, "$.n": True, "$.ok": False, "$.tags[0]": True,
                     "$.extra": False}
    assert tp == 4
    assert score(None, gold)[:3] == (0, 0, 6)


def test_auc() -> None:
    assert auc([0.9, 0.8], [0.1, 0.2]) == 1.0
    assert auc([0.1], [0.9]) == 0.0
    assert auc([0.5, 0.5], [0.5]) == 0.5
    assert math.isnan(auc([], [0.1]))


def test_first_json_in_free_text() -> None:
    assert first_json('Sure! ```json\n{"a": [1, 2]}\n``` done') == {"a": [1, 2]}
    assert first_json("no json {here") is None


def test_auc_of_rank_keys() -> None:
    # the bench ranks leaves by structgen.extract.confidence.rank: tuples (..., mean log-probability)
    assert auc([(True, -3.0)], [(False, -0.1)]) == 1.0
    assert auc([(True, -3.0), (False, -0.2)], [(True, -1.0), (False, -0.1)]) == 0.25
