"""The lexical half of ``auto``'s relevance (structgen.tools.lexical) and how it is combined.

Words: identifiers split, function words left out, endings cut. A tool's count: its name's
words the question uses, plus the weighted share of its description's. The turn's relevance
is the best tool's ``MODEL_WEIGHT * gain + lexical``: a question that uses a tool's own words
can call although the model's gain alone is below the threshold, and the scoring request
carries each allowed tool's count. Structure only, on a scripted backend.
"""

from __future__ import annotations

import pytest

import structgen as sg
from structgen.backends.fake import FakeBackend
from structgen.contract.backend import Capabilities
from structgen.tools.formats import INJECTED
from structgen.tools.lexical import DESCRIPTION_WEIGHT, STOPWORDS, lexical_score, lexical_scores, same_word, words
from structgen.tools.relevance import MODEL_WEIGHT, RelevanceRequest, combined, decide_relevance
from structgen.tools.spec import build_spec


@sg.tool
def get_prime_factors(number: int) -> list[int]:
    """Returns the prime factors of a positive integer."""
    return [number]


@sg.tool
def flightBook(origin: str, destination: str) -> str:
    """Book a flight between two airports."""
    return origin


TOOLS = [get_prime_factors, flightBook]


def test_words_split_identifiers_drop_function_words_and_cut_endings():
    assert words("get_prime_factors") == {"prime", "factor"}
    assert words("flightBook") == {"flight", "book"}
    assert words("math.hypot") == {"math", "hypot"}
    assert words("What are the prime factors of 450, please?") == {"prime", "factor"}
    assert words("booking flights") == {"book", "flight"}
    assert not words("I want to do it") and {"the", "what", "calculate"} <= STOPWORDS
    assert words("计算 450 的质因数") == frozenset()  # no ASCII words: the model's signal decides


def test_forms_of_one_word_match_without_a_stemmer():
    assert same_word("hypot", "hypotenuse") and same_word("hypotenuse", "hypot")  # one begins the other
    assert same_word(*sorted(words("pythagoras pythagorean")))  # a long shared beginning
    assert not same_word("pyt", "python") and not same_word("international", "internet")
    assert not same_word("weather", "whether")
    q = words("Compute the Pythagorean theorem")
    assert lexical_score(q, _tool("math.pythagoras", "")) == 1.0  # the name's "pythagora" is used


def _tool(name: str, description: str) -> sg.Tool:
    from structgen.tools import as_tool

    return as_tool({"type": "function", "function": {"name": name.replace(".", "_"), "description": description,
                                                     "parameters": {"type": "object", "properties": {}}}})


def test_the_count_is_name_hits_plus_the_weighted_description_share():
    q = words("What are the prime factors of 450?")
    desc = words(get_prime_factors.description)  # {prime, factor, positive, integer}
    assert desc == {"prime", "factor", "positive", "integer"}
    assert lexical_score(q, get_prime_factors) == pytest.approx(2 + DESCRIPTION_WEIGHT * 2 / len(desc))
    assert lexical_score(q, flightBook) == 0.0
    assert lexical_scores("Book a flight to Oslo", TOOLS) == [
        0.0, pytest.approx(2 + DESCRIPTION_WEIGHT * 2 / len(words(flightBook.description)))]


def test_the_turn_combines_the_model_gain_and_the_lexical_count():
    spec = build_spec(TOOLS, INJECTED)
    t = spec.relevance_threshold
    assert combined(1.0, 2.0) == pytest.approx(MODEL_WEIGHT + 2.0)
    low_gain = (t - 0.1) / MODEL_WEIGHT  # the gain alone falls short of the threshold
    assert decide_relevance(spec, [low_gain, 0.0]).mode == "none"
    called = decide_relevance(spec, [low_gain, 0.0], lexical=[0.2, 0.0])  # the words make up the rest
    assert called.mode == "auto" and called.relevance == pytest.approx(t + 0.1)
    assert called.relevance_parts == ((low_gain, 0.2), (0.0, 0.0))
    with pytest.raises(ValueError):
        decide_relevance(spec, [0.0, 0.0], lexical=[1.0])


@sg.program
def ask(s, question):
    s += sg.use_tools(TOOLS)
    s += sg.user(question)
    s += sg.assistant(sg.gen("turn", tools=TOOLS, max_tokens=48))


def test_the_scoring_request_carries_each_tools_count_and_the_meta_each_part():
    caps = Capabilities(regex=True, json_schema=True, grammar=True, tools=True, select="logprobs", prefix_cache=True,
                        sampling=frozenset({"max_new_tokens", "temperature"}))
    call = '<tool_call>[{"name": "get_prime_factors", "arguments": {"number": 450}}]</tool_call>'
    # no gain from the model at all: the words alone decide
    fb = FakeBackend([call], selector=lambda req: [[-1.0] * 3 for _ in req.choices], capabilities=caps)
    st = ask.run(question="What are the prime factors of 450?", backend=fb)
    st.raise_if_failed()
    scoring = fb.requests[0]
    assert isinstance(scoring, RelevanceRequest)
    assert scoring.lexical == tuple(lexical_scores("What are the prime factors of 450?", TOOLS))
    meta = st.get_meta_info("turn")
    assert [s["name"] for s in meta["tool_scores"]] == ["get_prime_factors", "flightBook"]
    assert [s["lexical"] for s in meta["tool_scores"]] == list(scoring.lexical)
    gains = [s["model"] for s in meta["tool_scores"]]
    best = max(combined(g, x) for g, x in zip(gains, scoring.lexical, strict=True))
    assert meta["tool_relevance"] == pytest.approx(best)
    assert max(gains) < 0 and meta["tool_relevance"] >= build_spec(TOOLS, INJECTED).relevance_threshold
    assert fb.requests[1].constraint.mode == "required"
    assert [c.name for c in st.tool_calls("turn")] == ["get_prime_factors"]
