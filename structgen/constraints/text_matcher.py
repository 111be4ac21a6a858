"""Whole-text membership with the constraint engine itself: llguidance over a byte vocabulary.

Final validation of a regex must accept exactly what the decoding mask allowed and must
never backtrack on model output. So the regex is compiled by the same engine (llguidance,
a lazily built automaton: linear in the text) for a 257-token vocabulary -- one token
per byte plus EOS -- and a text is valid iff its UTF-8 bytes are all consumed and the
matcher ends in an accepting state. The same translation of Python's ``\\w \\W \\s \\S``
that the decoding path uses (:func:`python_regex_to_rust`) applies here.

    accepts_regex(r"\\d{3}", "123")   # True
    check_regex("(?=a)a")            # ConstraintError: look-around is not supported

Compiled templates are cached per pattern (bounded); each check works on a copy.
llguidance is imported on first use, not with ``structgen``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from structgen.errors import ConstraintError

__all__ = ["accepts_grammar", "accepts_regex", "check_regex", "python_regex_to_rust"]

_PY_CLASSES = {
    # Python `re` (str patterns): \w is str.isalnum() or "_" -- letters and numbers, no
    # combining marks (Rust's \w has marks); \s is str.isspace() -- includes \x1c-\x1f.
    "w": r"[\p{L}\p{N}_]",
    "W": r"[^\p{L}\p{N}_]",
    "s": r"[\s\x1c-\x1f]",
    "S": r"[^\s\x1c-\x1f]",
}


def python_regex_to_rust(pattern: str) -> str:
    """Rewrite ``\\w \\W \\s \\S`` (outside and inside classes) to Python's Unicode meaning.

    Rust's regex syntax accepts nested classes, so ``[\\w-]`` becomes ``[[\\p{L}\\p{N}_]-]``.
    """
    out: list[str] = []
    i = 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            out.append(_PY_CLASSES.get(nxt, ch + nxt))
            i += 2
            continue
        out.append(ch)
        i += 1
    return "".join(out)


_EOS = 256
_CACHE_SIZE = 256


class _ByteTokens:
    """A vocabulary of the 256 bytes plus EOS, in llguidance's TokenizerWrapper shape."""

    def __init__(self) -> None:
        self.eos_token_id = _EOS
        self.bos_token_id = None
        self.tokens = [bytes([i]) for i in range(256)] + [b"<|eos|>"]
        self.special_token_ids = [_EOS]

    def __call__(self, text: bytes | str) -> list[int]:
        return list(text if isinstance(text, bytes) else text.encode("utf-8"))


_state: dict[str, Any] = {}
_templates: OrderedDict[tuple[str, str], Any] = OrderedDict()
_lock = threading.Lock()


def _tokenizer() -> Any:
    tok = _state.get("tokenizer")
    if tok is None:
        import llguidance

        tok = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_ByteTokens()), slices=[])
        _state["tokenizer"] = tok
    return tok


def _first_line(message: str) -> str:
    head = message.split("\n<state>", 1)[0].strip()
    return head if len(head) <= 300 else head[:297] + "..."


def _template(kind: str, source: str) -> Any:
    """The compiled matcher template for ``source`` (a regex or a Lark grammar), cached."""
    key = (kind, source)
    with _lock:
        found = _templates.get(key)
        if found is not None:
            _templates.move_to_end(key)
            return found
        tok = _tokenizer()
    import llguidance

    try:
        if kind == "regex":
            grammar = llguidance.LLMatcher.grammar_from_regex(python_regex_to_rust(source))
        else:
            grammar = llguidance.LLMatcher.grammar_from_lark(source)
        template = llguidance.LLMatcher(tok, grammar, log_level=0)
    except (ValueError, TypeError, RuntimeError, OverflowError) as exc:
        raise ConstraintError(f"cannot compile {kind}: {_first_line(str(exc))}", constraint=source) from exc
    if template.is_error():
        raise ConstraintError(f"cannot compile {kind}: {_first_line(template.get_error())}", constraint=source)
    with _lock:
        _templates[key] = template
        while len(_templates) > _CACHE_SIZE:
            _templates.popitem(last=False)
    return template


def check_regex(pattern: str) -> None:
    """Raise :class:`ConstraintError` unless the engine compiles ``pattern`` (cached)."""
    _template("regex", pattern)


def _accepts(kind: str, source: str, text: str) -> tuple[bool, str | None]:
    template = _template(kind, source)
    with _lock:  # deep_copy of a shared PyO3 object: keep borrows serial
        matcher = template.deep_copy()
    data = text.encode("utf-8", "surrogatepass")  # a lone surrogate is invalid UTF-8: rejected
    if data and not matcher.consume_tokens(list(data)):
        return False, _first_line(matcher.get_error()) if matcher.is_error() else None
    if matcher.is_error():
        return False, _first_line(matcher.get_error())
    return bool(matcher.is_accepting()), None


def accepts_regex(pattern: str, text: str) -> tuple[bool, str | None]:
    """Whether ``text`` fully matches ``pattern`` (Python syntax, as decoding enforces it),
    and the engine's reason when it stopped early. Linear in ``len(text)``."""
    return _accepts("regex", pattern, text)


def accepts_grammar(grammar: str, text: str) -> tuple[bool, str | None]:
    """Whether ``text`` is a complete sentence of the Lark ``grammar`` (llguidance's dialect)."""
    return _accepts("grammar", grammar, text)
