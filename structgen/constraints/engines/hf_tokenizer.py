"""A Hugging Face fast tokenizer's serialized form, as llguidance must read it.

llguidance learns each token's bytes from the tokenizer's JSON: for a byte-level BPE
(GPT-2 style: ``Ġ`` stands for the space byte) it maps the vocabulary through the
byte-level alphabet, for a byte-fallback BPE (SentencePiece style) it takes the token
strings as UTF-8. Some converters write a byte-level BPE with the byte-fallback flag and a
decoder chain of both kinds: transformers 5.17, converting a GGUF file (the default model
ships as one), writes ``"byte_fallback": true`` and ``Sequence[ByteFallback, Fuse,
Replace('▁', ' '), ByteLevel]`` for SmolLM2's GPT-2-style vocabulary. Read as written,
``Ġ"`` becomes the bytes ``C4 A0 22`` instead of ``' "'``: every mask around a space is
wrong, and a forced token is rejected by its own grammar.

:func:`llguidance_json` gives the JSON with that contradiction resolved: a BPE whose
pre-tokenizer is byte-level and whose vocabulary has no ``<0xNN>`` byte tokens cannot fall
back to bytes, so the flag is cleared and the decoder is the byte-level one. Anything
else is passed through unchanged. The caller's tokenizer is never modified.
"""

from __future__ import annotations

import json
import re
from copy import copy
from typing import Any

__all__ = ["is_byte_level", "llguidance_json", "normalize_tokenizer_json"]

_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


def _parts(node: Any) -> list[dict[str, Any]]:
    """A pre-tokenizer or decoder node flattened (a ``Sequence`` into its members)."""
    if not isinstance(node, dict):
        return []
    inner = node.get("pretokenizers") or node.get("decoders")
    if node.get("type") == "Sequence" and isinstance(inner, list):
        return [p for child in inner for p in _parts(child)]
    return [node]


def is_byte_level(spec: dict[str, Any]) -> bool:
    """Whether a tokenizer JSON (parsed) is a byte-level BPE: a BPE model behind a
    ``ByteLevel`` pre-tokenizer, with no ``<0xNN>`` byte tokens to fall back to."""
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        return False
    if not any(p.get("type") == "ByteLevel" for p in _parts(spec.get("pre_tokenizer"))):
        return False
    vocab = model.get("vocab") or {}
    return not any(_BYTE_TOKEN.fullmatch(tok) for tok in vocab)


def normalize_tokenizer_json(spec: dict[str, Any]) -> bool:
    """Resolve a byte-level BPE written with byte-fallback parts, in place (see the module
    doc). ``True`` when something changed."""
    if not is_byte_level(spec):
        return False
    changed = False
    model = spec["model"]
    if model.get("byte_fallback"):
        model["byte_fallback"] = False
        changed = True
    decoder = spec.get("decoder")
    parts = _parts(decoder)
    level = next((p for p in parts if p.get("type") == "ByteLevel"), None)
    if level is not None and len(parts) > 1:
        spec["decoder"] = level
        changed = True
    return changed


def llguidance_json(hf_tokenizer: Any) -> str:
    """The JSON llguidance reads for a fast tokenizer (as ``llguidance.hf.from_tokenizer``
    makes it: padding and truncation off), normalized by :func:`normalize_tokenizer_json`."""
    backend = copy(hf_tokenizer.backend_tokenizer)
    backend.no_padding()
    backend.no_truncation()
    text: str = backend.to_str()
    spec = json.loads(text)
    return json.dumps(spec) if normalize_tokenizer_json(spec) else text
