"""The BFCL benchmark's own AST-style checker (bench/bfcl_check.py)."""

from __future__ import annotations

import json

from bench.bfcl_check import Category, Record, check_calls, load_categories, to_json_schema

FUNCS = [{"name": "math.area", "parameters": {"type": "dict", "properties": {
    "base": {"type": "integer"}, "height": {"type": "float"}, "unit": {"type": "string"},
    "dims": {"type": "tuple", "items": {"type": "integer"}}}, "required": ["base", "height"]}},
    {"name": "lookup", "parameters": {"type": "dict", "properties": {"q": {"type": "string"}}, "required": ["q"]}}]
GOLD = [{"math.area": {"base": [10], "height": [5.0], "unit": ["units", ""], "dims": [[1, 2], ""]}}]


def rec(gold=GOLD):
    return Record("x", [{"role": "user", "content": "?"}], FUNCS, gold)


def test_simple_rules():
    simple = Category("simple_python")
    ok = [("math_area", {"base": 10, "height": 5}), ("math_area", {"base": 10.0, "height": 5, "unit": " Units"}),
          ("math_area", {"base": 10, "height": 5, "dims": [1, 2]})]
    bad = [("lookup", {"q": "x"}),                                       # wrong function
           ("math_area", {"base": 10}),                                  # required missing
           ("math_area", {"base": 10, "height": 5, "color": "red"}),     # unknown parameter
           ("math_area", {"base": 11, "height": 5}),                     # value not accepted
           ("math_area", {"base": "10", "height": 5}),                   # a string is not a number
           ("math_area", {"base": 10, "height": 5, "dims": [2, 1]})]     # list order matters
    for call in ok:
        assert check_calls([call], rec(), simple), call
    for call in bad:
        assert not check_calls([call], rec(), simple), call
    assert not check_calls([], rec(), simple)
    assert not check_calls([ok[0], ok[0]], rec(), simple)


def test_parallel_any_order_and_irrelevance():
    par = Category("parallel_multiple")
    gold = [{"lookup": {"q": ["Paris"]}}, {"math.area": {"base": [1], "height": [2]}}]
    calls = [("math_area", {"base": 1, "height": 2.0}), ("lookup", {"q": "paris"})]
    assert check_calls(calls, rec(gold), par) and check_calls(calls[::-1], rec(gold), par)
    assert not check_calls(calls[:1], rec(gold), par)
    assert not check_calls([calls[1], calls[1]], rec(gold), par)
    irr = Category("irrelevance")
    assert check_calls([], rec(None), irr) and not check_calls(calls[:1], rec(None), irr)


def test_rules_come_from_file_names(tmp_path):
    (tmp_path / "possible_answer").mkdir()
    for name in ("live_parallel_multiple", "live_irrelevance", "live_simple"):
        item = {"id": f"{name}_0", "question": [[{"role": "user", "content": "?"}]], "function": FUNCS}
        (tmp_path / f"BFCL_v4_{name}.json").write_text(json.dumps(item) + "\n")
        if "irrelevance" not in name:
            gold = {"id": f"{name}_0", "ground_truth": GOLD}
            (tmp_path / "possible_answer" / f"BFCL_v4_{name}.json").write_text(json.dumps(gold) + "\n")
    cats = {c.name: c for c in load_categories(tmp_path)}
    assert set(cats) == {"live_parallel_multiple", "live_irrelevance", "live_simple"}
    assert cats["live_parallel_multiple"].parallel and cats["live_parallel_multiple"].multiple
    assert cats["live_irrelevance"].irrelevance and not cats["live_simple"].parallel


def test_bfcl_types_become_json_schema():
    schema = to_json_schema(FUNCS[0]["parameters"])
    assert schema["type"] == "object" and schema["additionalProperties"] is False
    assert schema["properties"]["height"] == {"type": "number"}
    assert schema["properties"]["dims"] == {"type": "array", "items": {"type": "integer"}}
    assert to_json_schema({"type": "any"}) == {}


def test_calibration_picks_the_best_balanced_threshold() -> None:
    import pytest

    from bench.bfcl_calibrate import best_threshold

    calls = {"simple": [0.05, 0.04, 0.01], "multiple": [0.03, 0.002]}
    abstain = [0.001, 0.02, 0.005]
    t, bal, call_rate, abstain_rate = best_threshold(calls, abstain)
    # t=0.03: simple 2/3 and multiple 1/2 call, all 3 irrelevance abstain -> (7/12 + 1) / 2
    assert t == 0.03
    assert (call_rate, abstain_rate) == (pytest.approx(7 / 12), 1.0)
    assert bal == pytest.approx((7 / 12 + 1) / 2)
    # with no separating signal the lowest threshold (always call) wins the tie
    assert best_threshold({"a": [0.5]}, [0.5])[:2] == (0.5, 0.5)
    # relevance scores may be negative: the candidates are the scores seen
    assert best_threshold({"a": [0.2, 0.9]}, [-0.5, -0.1])[:2] == (0.2, 1.0)


def test_joint_calibration_keeps_the_abstain_rate_and_is_right_the_most() -> None:
    import pytest

    from bench.bfcl_calibrate import best_pair, joint_rates

    # (relevance, grounding, the committed calls pass); None = no value to check (always passes)
    calls = {"simple": [(1.2, 1.0, True), (0.8, 1.0, True), (1.5, 0.5, False)],
             "multiple": [(0.9, None, True), (0.3, 1.0, False)]}
    abstain = [(1.4, 0.0, False), (0.85, 1.0, False), (0.2, None, False)]
    # relevance >= 0.9 and grounding >= 0.5: simple 2/3 and multiple 1/2 call; (1.4, 0.0) fails
    # the grounding, the others the relevance: all abstain; right: simple 1/3, multiple 1/2
    assert joint_rates(calls, abstain, 0.9, 0.5) == (pytest.approx(7 / 12), 1.0, pytest.approx(5 / 12))
    tr, tg, accuracy, call_rate, abstain_rate = best_pair(calls, abstain, need=1.0)
    # relevance alone must reach 1.5 to abstain on all (calls 1/6, none right); a grounding test
    # lets the relevance fall to 0.9, just above the irrelevant 0.85
    assert (tr, tg) == (0.9, 0.5) and (accuracy, call_rate, abstain_rate) == (
        pytest.approx(5 / 12), pytest.approx(7 / 12), 1.0)
    assert best_pair(calls, abstain, need=2 / 3)[3] > call_rate  # a looser goal calls more
    # one grounding threshold only (the calibration's table rows): 0 is relevance alone
    assert best_pair(calls, abstain, need=1.0, groundings=[0.0]) == (1.5, 0.0, 0.0, pytest.approx(1 / 6), 1.0)
    # accuracy first: (0.97, 0) calls on 3 of 4 but 1 rightly; (0.9, 1.0) calls on 2, both right
    mixed = {"simple": [(1.0, 1.0, True), (1.0, 0.2, False), (0.97, 0.1, False), (0.9, 1.0, True)]}
    assert joint_rates(mixed, [(0.95, 0.3, False)], 0.97, 0.0) == (0.75, 1.0, 0.25)
    assert best_pair(mixed, [(0.95, 0.3, False)], need=1.0) == (0.9, 1.0, 0.5, 0.5, 1.0)
    # no seen pair abstains: reported
    assert best_pair({"a": [(1.0, 1.0, True)]}, [(1.0, 1.0, False)], need=1.0) is None
