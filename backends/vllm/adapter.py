"""vLLM's OpenAI-compatible server: completions with ``structured_outputs``, prompt logprobs.

Version matters (vllm-project/vllm#15636, dottxt-ai/outlines#1887):

- from 0.10.2 constraints go in ``"structured_outputs": {"json"|"regex"|"choice"|"grammar": ...}``;
  the old ``guided_json``/``guided_regex``/... fields, and top-level ``regex``/``json_schema``,
  are *accepted and silently ignored* from 0.12 on, so they are never sent to such a server;
- before 0.10.2 only the ``guided_*`` fields exist, and they are what is sent there.

Tool-calling turns (``gen(tools=...)``) are a Lark grammar (``structured_outputs.grammar``,
read by vLLM's guidance backend), which is stronger here than vLLM's own tool calling: in
0.32 its ``auto`` constrains calls only for parsers that have an xgrammar structural tag
(hermes, llama, qwen...; not e.g. ``xlam``, SmolLM2's format) and only on the chat route,
and ``required`` forces a JSON array rather than the model's own syntax. Before 0.10.2
there is no Lark route: a CapabilityError before sending. Calls are validated either way.

``select`` is scored from prompt log-probabilities (``prompt_logprobs``), with the prompt /
choice token boundary found by ``/tokenize`` (shared first tokens and leading spaces are
scored as the engine tokenizes them, whatever their merge).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from structgen.backends.openai.adapter import OpenAICompatBackend
from structgen.constraints.kind import Translations
from structgen.constraints.spec import (
    ChoiceSpec,
    ConstraintSpec,
    GrammarSpec,
    JsonSchemaSpec,
    RegexSpec,
)
from structgen.contract.backend import (
    Capabilities,
    GenerateRequest,
    GenerateResult,
    SelectRequest,
    SelectResult,
)
from structgen.contract.server import Call, Flow, require
from structgen.errors import BackendError, CapabilityError

__all__ = ["FIELDS", "VLLMBackend", "parse_version"]

STRUCTURED_OUTPUTS_SINCE = (0, 10, 2)


def parse_version(text: str | None) -> tuple[int, ...]:
    """``"0.32.0+cpu"`` -> ``(0, 32, 0)``; unknown -> ``()``."""
    out: list[int] = []
    for part in (text or "").split("+")[0].split("."):
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


class VLLMBackend(OpenAICompatBackend):
    """A vLLM OpenAI-compatible server (``python -m vllm.entrypoints.openai.api_server``).

    Text prompts go to ``/v1/completions`` (roles rendered with the model's own chat
    template, loaded from the served model directory when it is local, or from
    ``tokenizer=``), so the engine's prefix cache sees the program's shared text.
    """

    name = "vllm"
    route = "completions"

    def __init__(self, base_url: str = "http://127.0.0.1:8000", **kw: Any):
        super().__init__(base_url, **kw)

    def _server_version(self) -> str | None:
        body = self.http.get("/version", what="vllm version")
        return str(body.get("version")) if isinstance(body, Mapping) else None

    def _capabilities_for(self, version: str | None) -> Capabilities:
        v = parse_version(version)
        lark = not v or v >= STRUCTURED_OUTPUTS_SINCE  # older servers read EBNF grammars only
        return Capabilities(
            regex=True, json_schema=True, grammar=lark, choices=True, select="logprobs",
            # tool calls travel as the Lark grammar (see the module docstring)
            prefix_cache=True, tools=lark, streaming=False,
            chat_messages=False,
            sampling=frozenset({"max_new_tokens", "min_new_tokens", "temperature", "top_p", "top_k",
                                "min_p", "stop", "stop_token_ids", "seed", "frequency_penalty",
                                "presence_penalty", "ignore_eos", "return_logprob",
                                "top_logprobs_num"}))

    @property
    def structured_outputs(self) -> bool:
        v = parse_version(self.version)
        return not v or v >= STRUCTURED_OUTPUTS_SINCE

    def constraint_fields(self, spec: ConstraintSpec) -> dict[str, Any]:
        return FIELDS(spec, self)

    def build_payload(self, request: GenerateRequest) -> dict[str, Any]:
        payload = super().build_payload(request)
        p = request.params
        if p.return_logprob:
            payload.pop("return_logprob", None)
            payload.pop("top_logprobs_num", None)
            payload["logprobs"] = p.top_logprobs_num or 0
        return payload

    def parse_text(self, request: GenerateRequest, body: Mapping[str, Any]) -> GenerateResult:
        result = super().parse_text(request, body)
        lp = body["choices"][0].get("logprobs")
        if lp is not None and not isinstance(lp, Mapping):
            raise BackendError(f"unexpected response: choices[0].logprobs is not an object: {str(lp)[:200]}",
                               backend=self.name)
        if lp:
            result.meta["output_token_logprobs"] = lp.get("token_logprobs")
            if lp.get("top_logprobs") is not None:
                result.meta["output_top_logprobs"] = lp["top_logprobs"]
        return result

    def _warm_flow(self, prefix: str) -> Flow[None]:
        yield Call("/v1/completions", {"model": self.model, "prompt": prefix, "max_tokens": 1,
                                       "temperature": 0}, what="vllm prefix warm-up")
        return None

    # -- select by prompt logprobs -------------------------------------------------------
    def _tokenize(self, text: str) -> Call:
        return Call("/tokenize", {"model": self.model, "prompt": text}, what="vllm tokenize")

    def _expect_choices(self, entries: list[Any], n: int) -> None:
        if len(entries) != n:
            raise BackendError(f"the server returned {len(entries)} choices for {n} prompts", backend=self.name)

    def _prompt_logprobs(self, prompts: list[Any]) -> Call:
        return Call("/v1/completions", {"model": self.model, "prompt": prompts, "max_tokens": 1,
                                        "temperature": 0, "prompt_logprobs": 0},
                    what="vllm select (prompt logprobs)")

    def _token_logprobs(self, entry: Any, ids: list[int], start: int) -> list[float]:
        plp = require(entry, "prompt_logprobs", backend=self.name)
        out: list[float] = []
        for j in range(start, len(ids)):
            pos = plp[j]
            if pos is None:  # the very first prompt token has no logprob
                out.append(0.0)
                continue
            tok = pos.get(str(ids[j]))
            if tok is None:
                raise BackendError(f"prompt_logprobs lacks token {ids[j]} at position {j}", backend=self.name)
            out.append(float(tok["logprob"]) if isinstance(tok, Mapping) else float(tok))
        return out

    def _select_flow(self, request: SelectRequest) -> Flow[SelectResult]:
        base = yield self._tokenize(request.prompt)
        base_ids: list[int] = list(require(base, "tokens", backend=self.name))
        full_ids: list[list[int]] = []
        for choice in request.choices:
            body = yield self._tokenize(request.prompt + choice)
            full_ids.append(list(require(body, "tokens", backend=self.name)))
        starts = []
        for ids in full_ids:
            k = 0
            while k < min(len(ids), len(base_ids)) and ids[k] == base_ids[k]:
                k += 1
            if k == len(ids):  # an empty choice: score nothing
                k = len(ids)
            starts.append(k)
        body = yield self._prompt_logprobs(full_ids)
        entries = sorted(require(body, "choices", backend=self.name), key=lambda c: c.get("index", 0))
        self._expect_choices(entries, len(full_ids))
        cond = [self._token_logprobs(e, ids, k) for e, ids, k in zip(entries, full_ids, starts, strict=True)]
        uncond = None
        if request.need_unconditional:
            tails = [ids[k:] or ids[-1:] for ids, k in zip(full_ids, starts, strict=True)]
            body = yield self._prompt_logprobs(tails)
            entries = sorted(require(body, "choices", backend=self.name), key=lambda c: c.get("index", 0))
            self._expect_choices(entries, len(tails))
            uncond = [self._token_logprobs(e, t, 0)[: len(c)] for e, t, c in zip(entries, tails, cond, strict=True)]
        return SelectResult(input_token_logprobs=cond, unconditional_token_logprobs=uncond,
                            meta={"choice_token_counts": [len(c) for c in cond]})


# -- constraint translation, one entry per kind (structgen.constraints.kind) -------------------

#: spec class -> vLLM request fields: ``structured_outputs`` from 0.10.2, ``guided_*`` before
FIELDS: Translations[dict[str, Any]] = Translations("vllm")


@FIELDS.register(JsonSchemaSpec)
def _json_fields(spec: JsonSchemaSpec, backend: VLLMBackend) -> dict[str, Any]:
    if backend.structured_outputs:
        # whitespace: vLLM reads disable_any_whitespace from the *server* config only
        # (a per-request value is silently ignored), so it is never sent; the launch
        # recipe starts the server compact.
        return {"structured_outputs": {"json": spec.schema_dict}}
    out: dict[str, Any] = {"guided_json": spec.schema_dict}
    if spec.whitespace == "compact":
        out["guided_whitespace_pattern"] = ""
    return out


@FIELDS.register(RegexSpec)
def _regex_fields(spec: RegexSpec, backend: VLLMBackend) -> dict[str, Any]:
    if backend.structured_outputs:
        return {"structured_outputs": {"regex": spec.pattern}}
    return {"guided_regex": spec.pattern}


@FIELDS.register(ChoiceSpec)
def _choice_fields(spec: ChoiceSpec, backend: VLLMBackend) -> dict[str, Any]:
    choices = list(spec.choices)
    return {"structured_outputs": {"choice": choices}} if backend.structured_outputs else {"guided_choice": choices}


@FIELDS.register(GrammarSpec)
def _grammar_fields(spec: GrammarSpec, backend: VLLMBackend) -> dict[str, Any]:
    if not backend.structured_outputs:
        raise CapabilityError("Lark grammar constraints", backend=backend.name, version=backend.version,
                              hint="vLLM before 0.10.2 takes EBNF grammars only")
    return {"structured_outputs": {"grammar": spec.grammar}}
