"""The extraction prompt: instructions, few-shot examples, the document; and the
feedback turn of a retry.

Every record of a job (per schema) starts with the same text -- the system turn (the
instructions and the schema) and the few-shot turns -- so an engine's prefix cache
computes it once. Turns are rendered with the backend's own chat template, one role at a
time exactly as the DSL renders them (:class:`~structgen.contract.chat_template.ChatTemplate`),
so :meth:`PromptBuilder.shared_prefix` is a true prefix of every prompt. Backends that
take chat messages get the messages instead.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from structgen.contract.backend import Backend, GenerateRequest, Message, SamplingParams
from structgen.errors import InputError
from structgen.extract.records import InputRecord
from structgen.extract.schemas import Schema

__all__ = ["DEFAULT_INSTRUCTIONS", "PromptBuilder", "load_few_shot"]

DEFAULT_INSTRUCTIONS = (
    "Extract information from the document the user gives. Answer with one JSON object that "
    "follows this JSON schema:\n{schema}\n"
    "Copy names, numbers and dates exactly as the document writes them (dates as YYYY-MM-DD). "
    "Use null when the document does not give a value.")

FEEDBACK = ("Your JSON was rejected by the validator:\n{errors}\n"
            "Reply with the corrected JSON object only.")

Turn = tuple[str, str]


@dataclass(frozen=True)
class Example:
    text: str
    output: str  # compact JSON


def load_few_shot(path: str | Path) -> list[Example]:
    """Few-shot examples from a JSONL file of ``{"text": ..., "data": {...}}`` lines
    (``output`` or ``json`` are accepted for ``data``)."""
    out: list[Example] = []
    src = str(path)
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise InputError(f"cannot read few-shot file: {exc.strerror or exc}", source=src) from exc
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise InputError(f"not JSON: {exc}", source=src, where=f"line {n}") from exc
        data = next((obj[k] for k in ("data", "output", "json") if isinstance(obj, dict) and k in obj), None)
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str) or data is None:
            raise InputError('a few-shot line needs "text" and "data"', source=src, where=f"line {n}")
        out.append(Example(obj["text"], data if isinstance(data, str) else
                           json.dumps(data, ensure_ascii=False, separators=(",", ":"))))
    return out


class PromptBuilder:
    """Builds each record's conversation and renders it for one backend."""

    def __init__(self, backend: Backend, *, instructions: str | None = None,
                 examples: Sequence[Example] = (), include_schema: bool = True):
        self.backend = backend
        self.instructions = DEFAULT_INSTRUCTIONS if instructions is None else instructions
        self.examples = list(examples)
        self.include_schema = include_schema
        caps = backend.capabilities
        self.chat_messages = caps.chat_messages
        self.template = None if caps.chat_messages else backend.chat_template()

    # -- the conversation ---------------------------------------------------------------
    def system_text(self, schema: Schema) -> str:
        schema_text = schema.spec.schema if self.include_schema else ""
        return self.instructions.replace("{schema}", schema_text)

    def head(self, schema: Schema) -> list[Turn]:
        """The turns every record with this schema shares."""
        turns: list[Turn] = [("system", self.system_text(schema))]
        for ex in self.examples:
            turns += [("user", ex.text), ("assistant", ex.output)]
        return turns

    def turns(self, record: InputRecord, schema: Schema) -> list[Turn]:
        if record.messages:  # an OpenAI batch request: its own conversation
            return list(record.messages)
        return [*self.head(schema), ("user", record.text)]

    @staticmethod
    def feedback(turns: Sequence[Turn], raw: str, errors: Sequence[str]) -> list[Turn]:
        """The conversation of a retry: the rejected answer and the validator's messages."""
        shown = "\n".join(f"- {e}" for e in list(errors)[:8]) or "- the output is not valid"
        return [*turns, ("assistant", raw), ("user", FEEDBACK.format(errors=shown))]

    # -- rendering ----------------------------------------------------------------------
    def render(self, turns: Sequence[Turn], *, open_assistant: bool = True) -> str:
        """The prompt text: each turn in the template's role text, then (by default) an open
        assistant turn. Without a chat template: plain labelled paragraphs."""
        if self.template is None:
            body = "".join(f"{role.upper()}:\n{content}\n\n" for role, content in turns)
            return body + ("ASSISTANT:\n" if open_assistant else "")
        history: list[dict[str, str]] = []
        text = ""
        for role, content in turns:
            rt = self.template.role(role, history)
            text += rt.prefix + content + rt.suffix
            history.append({"role": role, "content": content})
        if open_assistant:
            text += self.template.role("assistant", history).prefix
        return text

    def shared_prefix(self, schema: Schema) -> str:
        """Text every prompt of this schema starts with (through the last shared turn)."""
        return self.render(self.head(schema), open_assistant=False)

    def request(self, turns: Sequence[Turn], schema: Schema, params: SamplingParams,
                record_id: str) -> GenerateRequest:
        messages = (*(Message(r, c) for r, c in turns), Message("assistant", ""))
        prompt = "" if self.chat_messages else self.render(turns)
        return GenerateRequest(prompt=prompt, params=params, constraint=schema.spec, messages=messages,
                               program="extract", variable=record_id, group=f"extract/{schema.digest}")
