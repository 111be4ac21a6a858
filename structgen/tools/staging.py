"""A parallel turn written call by call: as many calls as the tokens actually left allow.

:func:`structgen.tools.budget.fit_calls` plans a parallel turn for its worst case -- every
call at its longest, one token per character -- so a small ``max_tokens`` holds fewer calls
than the model would really write (192 tokens rarely hold two BFCL calls planned that way,
though such calls take 20-40 tokens). A turn that asks for more calls than that plan holds
(``k > k'``), on a backend that continues a text prompt, is *staged* instead
(:func:`first_stage`): its first request writes the turn's opening and one call (or the
answer), bounded to the whole budget as a single call is (less the room the worst-case
plan's other calls take at :data:`CALL_FLOOR`, when it holds ``k' > 1``: those are still
always possible), and ends right after the call;
each next request (:func:`next_stage`, sent by :mod:`structgen.lang.kinds.generate`)
continues the same text with the tokens really left and lets the model choose: the
block's end, or the separator and one more call, bounded to what is left. The choice of
another call is offered only while one more call fits at :data:`CALL_FLOOR` (its optional
arguments left out) and ``k`` calls are not written; else the block's end is added without
a request (it is fixed text). Every call is planned as the single call of the tokens left,
so the turn closes within ``max_tokens`` whatever the model writes. While the question
holds numbers no call has used, the next stage offers no end: it writes one more call, which
stands only if it closes and adds coverage (:mod:`structgen.tools.coverage`; otherwise it is
dropped, :meth:`Carry.drop`, and the block ends before it). Such a call is tried even where
the tokens left do not hold one more call at its worst (a call of a few numbers and names
takes far fewer tokens than characters): it is planned at :data:`CALL_FLOOR` and sent with
the tokens left, and if it does not close within them it is dropped -- the kept turn still
closes within ``max_tokens``. The joined text is
validated as one turn; its meta sums the stages' tokens (``completion_tokens``, and the
backend's ``cached_tokens`` / ``computed_tokens`` / ``forced_tokens``: each stage reads the
turn so far again, from the cache), keeps the first stage's ``prompt_tokens`` and counts
the requests (``tool_stages``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

from structgen.tools.budget import CALL_FLOOR, block_chars, fit_to_budget, longest_call
from structgen.tools.coverage import steered
from structgen.tools.definition import Tool
from structgen.tools.formats import ToolFormat
from structgen.tools.grammar import tool_grammar

if TYPE_CHECKING:
    from structgen.tools.calls import ToolCall
    from structgen.tools.spec import ToolCallSpec

__all__ = ["Carry", "calls_written", "closing", "first_stage", "next_stage", "stage_tokens", "written_calls"]


def _reserve(fmt: ToolFormat, tools: Sequence[Tool], calls: int) -> int:
    """The characters that ``calls`` more calls take at the floor, with their separators."""
    if calls <= 0 or not tools:
        return 0
    return math.ceil(calls * (len(fmt.separator) + longest_call(fmt, tools, CALL_FLOOR, lean=True)))


def _stage_grammar(fmt: ToolFormat, tools: Sequence[Tool], mode: str, *, max_tokens: int, reserved: int,
                   stage: str, think: tuple[Any, ...] | None = None, steer: Collection[float] = ()) -> str:
    """One stage's grammar: its call bounded to ``max_tokens`` less ``reserved`` characters
    (and held to use one of ``steer``'s numbers where a tool can: :func:`~structgen.tools.coverage.steered`)."""
    fitted = fit_to_budget(fmt, tools, max_tokens=max_tokens, reserved=reserved)
    return tool_grammar(fmt, [steered(t, steer) for t, _ in fitted], mode=mode, max_calls=1, think=think,
                        caps=[c for _, c in fitted], stage=stage)


def first_stage(fmt: ToolFormat, tools: Sequence[Tool], *, mode: str, max_tokens: int, promised: int = 1,
                reserved: int = 0, think: tuple[Any, ...] | None = None) -> str:
    """The grammar of a staged turn's first stage within ``max_tokens``. ``tools``: the
    allowed ones; ``promised``: the calls the worst-case plan holds (each stage's call
    leaves room for the rest of them at the floor); ``reserved``: a thinking section's bound."""
    return _stage_grammar(fmt, tools, mode, max_tokens=max_tokens, stage="first", think=think,
                          reserved=reserved + _reserve(fmt, tools, promised - 1))


def closing(spec: ToolCallSpec) -> str:
    """The fixed text that ends a staged turn's call block (none where each call is wrapped)."""
    fmt = spec.call_format
    return "]" + fmt.close if fmt.list_style else ""


def written_calls(spec: ToolCallSpec, text: str) -> list[ToolCall] | None:
    """The calls in ``text``, a staged turn so far, when the turn may go on after them
    (the block is open after a whole call); None when the turn is over (an answer, the
    block closed) -- or cut, which the turn's validation reports."""
    if spec.staged_budget is None or spec.mode == "none":
        return None
    end = closing(spec)
    if end and text.endswith(end):
        return None
    try:
        turn = spec.validate_output(text + end)
    except Exception:  # cut inside a call, or an answer
        return None
    return list(turn.calls) or None


def calls_written(spec: ToolCallSpec, text: str) -> int | None:
    """How many :func:`written_calls` there are (None where there are none)."""
    calls = written_calls(spec, text)
    return len(calls) if calls else None


def next_stage(spec: ToolCallSpec, *, remaining: int, calls_done: int, force: bool = False,
               steer: Collection[float] = ()) -> ToolCallSpec | None:
    """The spec of the stage after ``calls_done`` calls with ``remaining`` tokens left: the
    block's end or one more call (``force``: one more call, :mod:`structgen.tools.coverage`,
    steered to use one of the uncovered numbers ``steer``);
    None when no further call may be made (``k`` written, or one more does not fit): the
    block's end, :func:`closing`, is then added as it is. A forced call is tried even where
    one more call does not fit at its longest: its grammar is planned for a call at
    :data:`CALL_FLOOR` (its optional arguments left out), and a call that does not close
    within the tokens left is dropped like one that adds no coverage."""
    fmt, tools = spec.call_format, spec.allowed_tools
    if calls_done >= spec.max_calls or not tools:
        return None
    sep = len(fmt.separator)
    reserved = sep + _reserve(fmt, tools, spec.staged_promise - calls_done - 1)
    floor_call = longest_call(fmt, tools, CALL_FLOOR, lean=True)
    plan, room = remaining, remaining - 1 - block_chars(fmt) - sep
    if room < floor_call:
        if not force or room <= 0 or not math.isfinite(floor_call):
            return None
        # coverage's call is tried where the worst case does not fit: planned as a floor call
        # (one token per character), it may not close within the tokens left -- it is then dropped
        plan = math.ceil(floor_call) + 1 + block_chars(fmt) + reserved
    grammar = _stage_grammar(fmt, tools, spec.mode, max_tokens=plan, stage="more" if force else "next",
                             reserved=reserved, steer=steer if force else ())
    return dataclasses.replace(spec, grammar=grammar)


def stage_tokens(text: str, meta: dict[str, Any]) -> int:
    """The tokens a stage generated: the backend's count, else at most one per byte."""
    n = meta.get("completion_tokens")
    return int(n) if isinstance(n, int) and n >= 0 else len(text.encode("utf-8"))


#: meta lists of per-token values, joined across stages
_PER_TOKEN = ("output_token_logprobs", "output_token_constrained_logprobs", "output_top_logprobs")
#: meta counts summed across stages (every stage's prompt is read again: from the cache)
_SUMMED = ("cached_tokens", "computed_tokens", "forced_tokens")


@dataclasses.dataclass(frozen=True)
class Carry:
    """What a staged turn's earlier stages wrote: the text, the tokens, their meta."""

    first: Any  # the first stage's request (a retry starts over from it)
    text: str = ""
    tokens: int = 0
    stages: int = 0
    calls: int = 0
    per_token: tuple[tuple[str, tuple[Any, ...]], ...] = ()
    counts: tuple[tuple[str, int], ...] = ()
    prompt_tokens: int | None = None
    #: the turn before a stage that coverage asked for (:mod:`structgen.tools.coverage`):
    #: what stands if that stage's call is dropped
    before: Carry | None = None
    #: the text of calls written and dropped (they added no coverage)
    dropped: tuple[str, ...] = ()

    def drop(self) -> Carry:
        """The turn without the stage coverage asked for: its text and tokens dropped, its
        compute counted."""
        if self.before is None:
            raise ValueError("no stage to drop")
        return dataclasses.replace(self.before, counts=self.counts, stages=self.stages,
                                   dropped=(*self.before.dropped, self.text[len(self.before.text):]))

    def add(self, text: str, meta: dict[str, Any]) -> Carry:
        joined = dict(self.per_token)
        for key in _PER_TOKEN:
            if isinstance(meta.get(key), list):
                joined[key] = joined.get(key, ()) + tuple(meta[key])
        counts = dict(self.counts)
        for key in _SUMMED:
            if isinstance(meta.get(key), int):
                counts[key] = counts.get(key, 0) + meta[key]
        first = meta.get("prompt_tokens") if self.stages == 0 else self.prompt_tokens
        return dataclasses.replace(self, text=self.text + text, tokens=self.tokens + stage_tokens(text, meta),
                                   stages=self.stages + 1, per_token=tuple(joined.items()),
                                   counts=tuple(counts.items()), prompt_tokens=first)

    def closed(self, spec: ToolCallSpec) -> Carry:
        """The turn with its block's end added (fixed text: no tokens)."""
        return dataclasses.replace(self, text=self.text + closing(spec))

    def meta(self, meta: dict[str, Any]) -> dict[str, Any]:
        """The last stage's ``meta`` for the whole turn."""
        out = dict(meta)
        out["completion_tokens"] = self.tokens
        out["tool_stages"] = self.stages
        if self.dropped:
            out["dropped_calls"] = list(self.dropped)
        for key, values in self.per_token:
            out[key] = list(values)
        out.update(self.counts)
        if self.prompt_tokens is not None:  # the turn's prompt: the first stage's
            out["prompt_tokens"] = self.prompt_tokens
        return out
