"""The repetition mark of per-field confidence: list items that copy an earlier item's value."""

from __future__ import annotations

import json

import pytest

from structgen.extract.confidence import leaf_confidence
from structgen.extract.repetition import Repeats, wildcard


def test_wildcard() -> None:
    assert wildcard("$.a[2].b[10]") == "$.a[*].b[*]"
    assert wildcard('$.a["x y"]') == '$.a["x y"]'


def _marks(obj: object) -> dict[str, bool | None]:
    text = json.dumps(obj)
    return {k: c.get("repeated") for k, c in leaf_confidence(text, [(0, len(text), -0.2)]).items()}


def test_a_list_loop_is_marked_from_its_first_copy() -> None:
    meds = [{"name": "Ibuprofen", "dose": 12.5}, {"name": "Aspirin", "dose": 50},
            {"name": "ibuprofen ", "dose": 12.5}, {"name": "Aspirin", "dose": 50.0}]
    marks = _marks({"patient": "Ada", "meds": meds})
    assert marks == {"$.patient": None,
                     "$.meds[0].name": False, "$.meds[0].dose": False,
                     "$.meds[1].name": False, "$.meds[1].dose": False,
                     "$.meds[2].name": True, "$.meds[2].dose": True,  # normalised: case, spaces
                     "$.meds[3].name": True, "$.meds[3].dose": True}  # 50 == 50.0


def test_booleans_null_and_other_fields_are_not_judged() -> None:
    items = [{"ok": True, "n": None, "a": "x", "b": "y"}, {"ok": True, "n": None, "a": "y", "b": "x"}]
    marks = _marks({"items": items})
    assert marks["$.items[1].ok"] is None and marks["$.items[1].n"] is None
    # the same value under another field, or in another item's other field, is no repeat
    assert marks["$.items[1].a"] is False and marks["$.items[1].b"] is False


def test_plain_lists_and_nested_lists() -> None:
    marks = _marks({"tags": ["a", "b", "a"], "rows": [[1, 2], [2, 3]]})
    assert [marks[f"$.tags[{i}]"] for i in range(3)] == [False, False, True]
    # nested lists share one wildcard path: the 2 of the second row repeats the first row's
    assert [marks["$.rows[0][0]"], marks["$.rows[0][1]"], marks["$.rows[1][0]"], marks["$.rows[1][1]"]] == \
        [False, False, True, False]


@pytest.mark.parametrize("value", [True, None, float("nan"), {"a": 1}])
def test_repeats_ignores_what_it_cannot_judge(value: object) -> None:
    r = Repeats()
    assert r.repeated("$.a[0]", value) is None and r.repeated("$.a[1]", value) is None


def test_a_leaf_cut_short_is_not_judged() -> None:
    text = '{"a": ["x", "x'
    conf = leaf_confidence(text, [(0, len(text), -0.1)])
    assert conf["$.a[0]"]["repeated"] is False and "repeated" not in conf["$.a[1]"]
