"""``tool_choice="auto"`` in the injected format: the first decision, scored by the model.

The injected ``structgen`` format under ``auto`` opens the call block and lets the model
decide after ``<tool_call>[`` (``]`` = no call); a small model almost always calls there.
So on a backend that returns top log-probabilities and has a prefix cache (the probe's
prompt is then reused by the turn itself) the turn first asks the model one
question: how likely does the turn start with the call block? One token's top
log-probabilities at the turn's start are read (a probe request that adds no text), and
the probability of the tokens that begin ``<tool_call>`` is the *call probability*:

* at least ``call_threshold`` (:data:`DEFAULT_CALL_THRESHOLD`, or ``tool_choice={"mode":
  "auto", "call_threshold": p}``): the turn is the call block, as before (the model may
  still write ``[]`` and answer);
* below it: the turn is a plain answer (``tool_choice="none"``'s grammar: text that never
  contains the call trigger).

Either way the grammar is the constraint, so every call that is made is valid. The
probability is in the gen's meta (``call_probability``). ``call_threshold=0`` turns the
decision off; a thinking section, native formats and other backends keep the grammar's
own decision.

Where the backend also scores ``select`` by log-probabilities, a turn answering a user
message is decided by relevance instead (:mod:`structgen.tools.relevance`, a sharper signal
on small models); this probe then decides the turns after tool results, and every turn when
``call_threshold`` is given without ``relevance_threshold``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from structgen.contract.backend import SamplingParams
from structgen.tools.grammar import tool_grammar
from structgen.tools.spec import ToolCallSpec

__all__ = ["DEFAULT_CALL_THRESHOLD", "PROBE_TOP", "as_answer", "call_probability", "decide", "probe_params"]

#: the call probability at or above which ``auto`` opens the call block: calibrated for
#: SmolLM2-135M-Instruct by ``bench/bfcl_calibrate.py`` on BFCL records 100-139 of each
#: category (disjoint from the records ``bench/bfcl.py`` scores): 0.0157 gave the best
#: balanced accuracy, 0.650 (call categories call 0.600, irrelevance abstains 0.700) -- a
#: weak signal for a 135M model; other models should calibrate their own
DEFAULT_CALL_THRESHOLD = 0.016
#: how many top tokens the probe reads
PROBE_TOP = 20


def probe_params(params: SamplingParams) -> SamplingParams:
    """The probe's parameters: one greedy token with its top log-probabilities."""
    return dataclasses.replace(params, max_new_tokens=1, min_new_tokens=None, n=None, temperature=0.0,
                               return_logprob=True, top_logprobs_num=PROBE_TOP, return_text_in_logprobs=True,
                               logprob_start_len=None)


def call_probability(meta: Mapping[str, Any], trigger: str) -> float:
    """The probability of the first tokens that begin ``trigger``, from a probe's meta."""
    tops = meta.get("output_top_logprobs") or []
    first = tops[0] if tops else []
    # (logprob, token id, text) entries (embedded) or a {text: logprob} map (OpenAI completions)
    pairs = (list(first.items()) if isinstance(first, Mapping)
             else [(e[2], e[0]) for e in first or [] if len(e) > 2])
    total = 0.0
    for text, logprob in pairs:
        if isinstance(text, str) and text and (trigger.startswith(text) or text.startswith(trigger)):
            total += math.exp(float(logprob))
    return min(total, 1.0)


def as_answer(spec: ToolCallSpec, **fields: Any) -> ToolCallSpec:
    """``spec`` decided as a plain answer (``tool_choice="none"``'s grammar: the call
    trigger can never be written), with ``fields`` replaced too."""
    grammar = tool_grammar(spec.call_format, [], mode="none", max_calls=1, think=spec.think)
    return dataclasses.replace(spec, grammar=grammar, mode="none", **fields)


def decide(spec: ToolCallSpec, meta: Mapping[str, Any]) -> ToolCallSpec:
    """The turn's spec after the probe: the call block, or a plain answer."""
    p = call_probability(meta, spec.call_format.trigger)
    if spec.call_threshold is None or p >= spec.call_threshold:
        return dataclasses.replace(spec, call_probability=p)
    return as_answer(spec, call_probability=p)
