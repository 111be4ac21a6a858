"""How many of a tool's own words the user's question uses: the lexical half of ``auto``'s relevance.

Tool retrieval's oldest signal. A question that a tool serves usually names what the tool
does with the tool's own words ("the *prime factors* of 450" for ``get_prime_factors``;
"*book* a *flight*" for ``flight_book``); a question no tool serves shares few of them. The
small model's own relevance (:mod:`structgen.tools.relevance`, a log-probability gain)
separates the two weakly, so the turn's relevance adds this count::

    lexical(tool) = |Q & words(name)| + DESCRIPTION_WEIGHT * |Q & words(description)| / |words(description)|

where ``Q`` is the question's word set. Words are lower-cased ASCII letter runs of three or
more (identifiers are split at ``_``, ``.`` and camelCase), with common English function
words (:data:`STOPWORDS`, in any of their forms) left out and a plural / ``-ing`` / ``-ed``
ending cut (``factors`` and ``factor`` are one word); two words also count as one when one
begins the other (``hypot``, ``hypotenuse``) or they share a long beginning
(``pythagoras``, ``pythagorean``: :func:`same_word`). Only letters count: numbers and names are what grounding
(:mod:`structgen.tools.grounding`) reads. A language without ASCII words scores 0 here and
is decided by the model's signal alone.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

from structgen.tools.definition import Tool

__all__ = ["DESCRIPTION_WEIGHT", "PREFIX_MIN", "SHARED_MIN", "STOPWORDS", "lexical_score", "lexical_scores",
           "same_word", "words"]

#: how much a description whose every word the question uses counts, against one hit in the
#: tool's name (names are short and chosen to say what the tool does; descriptions are long)
DESCRIPTION_WEIGHT = 2.0
#: function words and the verbs of any request ("find", "get", "calculate"...), which every
#: question and half of the tools share
_STOP = ("a an the of to in on for and or is are be by with what how which from at as it this that i me my you "
         "your can could would will please find get give calculate compute tell about using use given some any all "
         "do does did its into per than then there their them they we our us was were if not no yes also want need "
         "know show let make like just has have had been being should may might must shall calculates calculated "
         "calculating computes computed finds gets gives returns return retrieves retrieve based specific other "
         "who whose where when")
STOPWORDS = frozenset(_STOP.split())
_ENDINGS = ("ings", "ing", "ies", "es", "s", "ed", "ly")
_WORD = re.compile(r"[a-z]+")
_CAMEL = re.compile(r"([a-z])([A-Z])")


def _stem(word: str) -> str:
    for end in _ENDINGS:
        if len(word) > len(end) + 3 and word.endswith(end):
            return word[:-len(end)]
    return word


_STEMMED_STOPWORDS = frozenset(_stem(w) for w in STOPWORDS)
#: two words are one when one, at least this long, begins the other (``hypot``,
#: ``hypotenuse``) ...
PREFIX_MIN = 4
#: ... or when they begin with the same this many letters (``pythagoras``, ``pythagorean``)
SHARED_MIN = 7


@lru_cache(maxsize=4096)
def words(text: str) -> frozenset[str]:
    """The content words of ``text`` (see the module's doc)."""
    text = _CAMEL.sub(r"\1 \2", text.replace("_", " ").replace(".", " "))
    return frozenset(_stem(w) for w in _WORD.findall(text.lower())
                     if len(w) > 2 and w not in STOPWORDS and _stem(w) not in _STEMMED_STOPWORDS)


def same_word(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` are one word: equal, one a long enough beginning of the other,
    or a long enough shared beginning (a stemmer's reach, without its tables)."""
    if a == b:
        return True
    short, long_ = (a, b) if len(a) <= len(b) else (b, a)
    return (len(short) >= PREFIX_MIN and long_.startswith(short)) or (
        len(short) >= SHARED_MIN and long_[:SHARED_MIN] == short[:SHARED_MIN])


def _hits(question: frozenset[str], tool_words: frozenset[str]) -> int:
    """How many of ``tool_words`` the question uses."""
    return sum(1 for w in tool_words if w in question or any(same_word(w, q) for q in question))


def lexical_score(question: frozenset[str], tool: Tool) -> float:
    """``lexical(tool)`` for a question's word set."""
    name = words(tool.name)
    desc = words(tool.description or "")
    share = _hits(question, desc) / len(desc) if desc else 0.0
    return _hits(question, name) + DESCRIPTION_WEIGHT * share


def lexical_scores(query: str, tools: Sequence[Tool]) -> list[float]:
    """Per tool, in order: how many of its words ``query`` uses."""
    q = words(query)
    return [lexical_score(q, t) for t in tools]
