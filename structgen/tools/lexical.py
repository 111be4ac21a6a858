"""How many of a tool's own words the user's question uses: the lexical half of ``auto``'s relevance.

Tool retrieval's oldest signal. A question that a tool serves usually names what the tool
does with the tool's own words ("the *prime factors* of 450" for ``get_prime_factors``;
"*book* a *flight*" for ``flight_book``); a question no tool serves shares few of them. The
small model's own relevance (:mod:`structgen.tools.relevance`, a log-probability gain)
separates the two weakly, so the turn's relevance adds this count::

    lexical(tool) = |Q & words(name)| + DESCRIPTION_WEIGHT * |Q & words(description)| / |words(description)|

where ``Q`` is the question's word set. Words are lower-cased ASCII letter runs of three or
more (identifiers are split at ``_``, ``.`` and camelCase), with common English function
words (:data:`STOPWORDS`) left out and a plural / ``-ing`` / ``-ed`` ending cut (``factors``
and ``factor`` are one word). Only letters count: numbers and names are what grounding
(:mod:`structgen.tools.grounding`) reads. A language without ASCII words scores 0 here and
is decided by the model's signal alone.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import lru_cache

from structgen.tools.definition import Tool

__all__ = ["DESCRIPTION_WEIGHT", "STOPWORDS", "lexical_score", "lexical_scores", "words"]

#: how much a description whose every word the question uses counts, against one hit in the
#: tool's name (names are short and chosen to say what the tool does; descriptions are long)
DESCRIPTION_WEIGHT = 2.0
#: function words and the verbs of any request ("find", "get", "calculate"...), which every
#: question and half of the tools share
_STOP = ("a an the of to in on for and or is are be by with what how which from at as it this that i me my you "
         "your can could would will please find get give calculate compute tell about using use given some any all "
         "do does did its into per than then there their them they we our us was were if not no yes also want need "
         "know show let make like just has have had been being should may might must shall")
STOPWORDS = frozenset(_STOP.split())
_ENDINGS = ("ings", "ing", "ies", "es", "s", "ed", "ly")
_WORD = re.compile(r"[a-z]+")
_CAMEL = re.compile(r"([a-z])([A-Z])")


def _stem(word: str) -> str:
    for end in _ENDINGS:
        if len(word) > len(end) + 3 and word.endswith(end):
            return word[:-len(end)]
    return word


@lru_cache(maxsize=4096)
def words(text: str) -> frozenset[str]:
    """The content words of ``text`` (see the module's doc)."""
    text = _CAMEL.sub(r"\1 \2", text.replace("_", " ").replace(".", " "))
    return frozenset(_stem(w) for w in _WORD.findall(text.lower()) if len(w) > 2 and w not in STOPWORDS)


def lexical_score(question: frozenset[str], tool: Tool) -> float:
    """``lexical(tool)`` for a question's word set."""
    name = words(tool.name)
    desc = words(tool.description or "")
    share = len(question & desc) / len(desc) if desc else 0.0
    return len(question & name) + DESCRIPTION_WEIGHT * share


def lexical_scores(query: str, tools: Sequence[Tool]) -> list[float]:
    """Per tool, in order: how many of its words ``query`` uses."""
    q = words(query)
    return [lexical_score(q, t) for t in tools]
