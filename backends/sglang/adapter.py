"""SGLang runtime, native ``/generate``: ``sampling_params`` {regex, json_schema, ebnf}, logprobs.

From SGLang's documentation for the current release (``GenerateReqInput``,
``sampling_params.md``, ``structured_outputs``): one constraint per request in
``sampling_params`` -- ``json_schema`` (JSON *text*), ``regex``, ``ebnf``. The grammar
dialect depends on the server's ``--grammar-backend``: xgrammar (default) reads GGML BNF,
llguidance reads Lark, outlines reads none. structgen's grammars are Lark, so grammar
constraints are declared only for an llguidance server (read from ``/get_server_info``).

Tool-calling turns are the same Lark grammar in ``ebnf`` (an llguidance grammar backend
only); with xgrammar or outlines they are a CapabilityError before sending (the native
``/generate`` route has no tools).

``select`` follows SGLang's own runtime endpoint: the prompt's token count from a
``max_new_tokens=0`` call, then prompt+choice with ``return_logprob`` and
``logprob_start_len`` just before the boundary; ``input_token_logprobs`` entries are
``[logprob, token_id, text]``.

Unverified against a live engine here (no CPU build of sgl-kernel): see ``gpu_check.sh``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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
from structgen.contract.server import Call, Flow, ServerBackend, finish_reason, require, text_field
from structgen.errors import BackendError, CapabilityError

__all__ = ["FIELDS", "SGLangBackend", "choice_regex"]

_SAMPLING = {
    "max_new_tokens": "max_new_tokens", "min_new_tokens": "min_new_tokens", "stop": "stop",
    "stop_token_ids": "stop_token_ids", "temperature": "temperature", "top_p": "top_p",
    "top_k": "top_k", "min_p": "min_p", "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty", "ignore_eos": "ignore_eos", "n": "n",
    "stop_regex": "stop_regex",
}


def choice_regex(choices: tuple[str, ...]) -> str:
    """A regex matching exactly one of ``choices`` (escaped, longest first)."""
    import re

    return "(" + "|".join(re.escape(c) for c in sorted(choices, key=len, reverse=True)) + ")"


class SGLangBackend(ServerBackend):
    """An SGLang server (``python -m sglang.launch_server``), native API."""

    name = "sglang"

    def __init__(self, base_url: str = "http://127.0.0.1:30000", *, grammar_backend: str | None = None,
                 **kw: Any):
        self.grammar_backend = grammar_backend
        super().__init__(base_url, **kw)

    # -- detection --------------------------------------------------------------------
    def _detect(self) -> tuple[str | None, Capabilities]:
        info: Mapping[str, Any] = {}
        for path in ("/get_server_info", "/server_info"):
            try:
                info = self.http.get(path, what="sglang server info", retries=1)
                break
            except BackendError as exc:
                if exc.status != 404:
                    raise
        version = info.get("version")
        if self.grammar_backend is None:
            self.grammar_backend = info.get("grammar_backend") or "xgrammar"
        if self._tokenizer_path is None:
            self._tokenizer_path = info.get("tokenizer_path") or info.get("model_path")
        if self.model is None:
            self.model = info.get("served_model_name") or info.get("model_path")
        return (str(version) if version else None), self._capabilities_for(version)

    def _capabilities_for(self, version: str | None) -> Capabilities:
        gb = self.grammar_backend or "xgrammar"
        return Capabilities(
            regex=gb != "none", json_schema=gb != "none", grammar=gb == "llguidance",
            choices=gb != "none", select="logprobs", prefix_cache=True,
            tools=gb == "llguidance", streaming=False, chat_messages=False,  # tool calls: the Lark grammar
            sampling=frozenset(_SAMPLING) - {"n"} | {"return_logprob", "logprob_start_len",
                                                   "top_logprobs_num", "seed"})

    # -- translation ------------------------------------------------------------------
    def constraint_fields(self, spec: ConstraintSpec) -> dict[str, Any]:
        return FIELDS(spec, self)

    def build_payload(self, request: GenerateRequest) -> dict[str, Any]:
        p = request.params
        sp: dict[str, Any] = {}
        for name in p.set_fields():
            if name in _SAMPLING:
                value = getattr(p, name)
                sp[_SAMPLING[name]] = list(value) if isinstance(value, tuple) else value
        if request.constraint is not None:
            sp.update(self.constraint_fields(request.constraint))
        payload: dict[str, Any] = {"text": request.prompt, "sampling_params": sp}
        if p.seed is not None:
            sp["sampling_seed"] = p.seed
        if p.return_logprob:
            payload["return_logprob"] = True
            if p.logprob_start_len is not None:
                payload["logprob_start_len"] = p.logprob_start_len
            if p.top_logprobs_num is not None:
                payload["top_logprobs_num"] = p.top_logprobs_num
            if p.return_text_in_logprobs:
                payload["return_text_in_logprobs"] = True
        return payload

    def parse_generate(self, request: GenerateRequest, body: Any) -> GenerateResult:
        """The ``text`` of a ``/generate`` answer (a BackendError quoting the body when it is
        not a string, or when ``meta_info`` is not an object)."""
        if isinstance(body, list):
            body = require(body, 0, backend=self.name)
        text = text_field(require(body, "text", backend=self.name), field="text", body=body, backend=self.name)
        meta_info = body.get("meta_info") or {}
        if not isinstance(meta_info, Mapping):
            raise BackendError(f"unexpected response: meta_info is not an object: {str(meta_info)[:200]}",
                               backend=self.name)
        fr = meta_info.get("finish_reason")
        if isinstance(fr, Mapping) and fr.get("type") == "abort":
            raise BackendError(f"request aborted by the server: {fr.get('message') or fr}",
                               backend=self.name, retryable=False)
        self._count_usage(meta_info)
        return GenerateResult(text=text, finish_reason=finish_reason(fr),  # type: ignore[arg-type]
                              meta={"meta_info": meta_info})

    def _generate_flow(self, request: GenerateRequest) -> Flow[GenerateResult]:
        body = yield Call("/generate", self.build_payload(request), what="sglang generate")
        return self.parse_generate(request, body)

    def _warm_flow(self, prefix: str) -> Flow[None]:
        yield Call("/generate", {"text": prefix, "sampling_params": {"max_new_tokens": 0, "temperature": 0}},
                   what="sglang prefix warm-up")
        return None

    # -- select ------------------------------------------------------------------------
    @staticmethod
    def _logprobs(entries: list[Any]) -> list[float]:
        return [0.0 if e[0] is None else float(e[0]) for e in entries]

    def _select_flow(self, request: SelectRequest) -> Flow[SelectResult]:
        body = yield Call("/generate", {"text": request.prompt,
                                        "sampling_params": {"max_new_tokens": 0, "temperature": 0}},
                          what="sglang select (prompt length)")
        prompt_len = int(require(body, "meta_info", "prompt_tokens", backend=self.name))
        start = max(prompt_len - 2, 0)
        body = yield Call("/generate", {
            "text": [request.prompt + c for c in request.choices],
            "sampling_params": {"max_new_tokens": 0, "temperature": 0},
            "return_logprob": True, "logprob_start_len": start}, what="sglang select (logprobs)")
        if not isinstance(body, list) or len(body) != len(request.choices):
            raise BackendError(f"select: expected {len(request.choices)} results, got {str(body)[:200]}",
                               backend=self.name)
        cond = []
        for item in body:
            entries = require(item, "meta_info", "input_token_logprobs", backend=self.name)
            cond.append(self._logprobs(entries[prompt_len - start:]))
        uncond = None
        if request.need_unconditional:
            body = yield Call("/generate", {
                "text": list(request.choices), "sampling_params": {"max_new_tokens": 0, "temperature": 0},
                "return_logprob": True, "logprob_start_len": 0}, what="sglang select (unconditional)")
            uncond = []
            if len(body) != len(cond):
                raise BackendError(f"the server returned {len(body)} results for {len(cond)} prompts",
                                   backend=self.name)
            for item, c in zip(body, cond, strict=True):
                lps = self._logprobs(require(item, "meta_info", "input_token_logprobs", backend=self.name))
                uncond.append((lps[-len(c):] if c else []) + [0.0] * max(0, len(c) - len(lps)))
        return SelectResult(input_token_logprobs=cond, unconditional_token_logprobs=uncond,
                            meta={"prompt_tokens": prompt_len})



# -- constraint translation, one entry per kind (structgen.constraints.kind) -------------------

#: spec class -> ``sampling_params`` fields of SGLang's native ``/generate``
FIELDS: Translations[dict[str, Any]] = Translations("sglang")


@FIELDS.register(JsonSchemaSpec)
def _json_fields(spec: JsonSchemaSpec, backend: SGLangBackend) -> dict[str, Any]:
    return {"json_schema": spec.schema}


@FIELDS.register(RegexSpec)
def _regex_fields(spec: RegexSpec, backend: SGLangBackend) -> dict[str, Any]:
    return {"regex": spec.pattern}


@FIELDS.register(ChoiceSpec)
def _choice_fields(spec: ChoiceSpec, backend: SGLangBackend) -> dict[str, Any]:
    return {"regex": choice_regex(spec.choices)}


@FIELDS.register(GrammarSpec)
def _grammar_fields(spec: GrammarSpec, backend: SGLangBackend) -> dict[str, Any]:
    if backend.grammar_backend != "llguidance":
        raise CapabilityError("Lark grammar constraints", backend=backend.name, version=backend.version,
                              hint=f"grammar backend {backend.grammar_backend!r} reads GGML BNF; "
                                   "start the server with --grammar-backend llguidance")
    return {"ebnf": spec.grammar}
