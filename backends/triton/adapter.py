"""Triton Inference Server's generate endpoint: ``POST /v2/models/<m>/generate``.

Triton maps the JSON keys of a generate request onto the model's inputs; a key that is
*not* an input is taken as a request parameter and, for an LLM model, ignored. So the
adapter reads the model's metadata (``GET /v2/models/<m>``) and declares a constraint
only when the model has the inputs that carry it; otherwise it is a capability error.

Two model flavours, as their Triton backends document them:

- ``tensorrtllm`` (the TensorRT-LLM backend's ``ensemble`` / ``tensorrt_llm_bls``):
  ``text_input``, ``max_tokens``, ``temperature``, ``top_k``, ``top_p``, ``stop_words``,
  ``random_seed`` and guided decoding through ``guided_decoding_guide_type``
  (``json_schema`` | ``regex`` | ``ebnf_grammar`` | ``json``) + ``guided_decoding_guide``;
- ``vllm`` (the vLLM backend's ``model.py``): ``text_input``, ``stream``,
  ``exclude_input_in_output`` and a JSON ``sampling_parameters`` string, whose
  ``guided_decoding`` object the backend turns into vLLM's guided-decoding params.

Output: ``text_output`` (the TensorRT-LLM ensemble returns the continuation; the vLLM
backend is asked to exclude the prompt). Servers that also return ``finish_reason`` get
it passed through. ``select`` is a constrained choice (regex alternation).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from structgen.backends.sglang.adapter import choice_regex
from structgen.constraints.kind import Translations
from structgen.constraints.spec import (
    ChoiceSpec,
    ConstraintSpec,
    JsonSchemaSpec,
    RegexSpec,
)
from structgen.contract.backend import Capabilities, GenerateRequest, GenerateResult
from structgen.contract.server import Call, Flow, ServerBackend, finish_reason, require, text_field
from structgen.errors import BackendError, CapabilityError

__all__ = ["GUIDED_DECODING", "GUIDES", "TritonBackend"]

FLAVORS = ("tensorrtllm", "vllm")
_TRT_SAMPLING = {"max_new_tokens": "max_tokens", "temperature": "temperature", "top_k": "top_k",
                 "top_p": "top_p", "stop": "stop_words", "seed": "random_seed",
                 "frequency_penalty": "frequency_penalty", "presence_penalty": "presence_penalty"}
_VLLM_SAMPLING = {"max_new_tokens": "max_tokens", "temperature": "temperature", "top_k": "top_k",
                  "top_p": "top_p", "min_p": "min_p", "stop": "stop", "seed": "seed",
                  "frequency_penalty": "frequency_penalty", "presence_penalty": "presence_penalty",
                  "min_new_tokens": "min_tokens", "ignore_eos": "ignore_eos",
                  "stop_token_ids": "stop_token_ids"}


class TritonBackend(ServerBackend):
    """A model served by Triton (``tritonserver``, or PyTriton's bundled one)."""

    name = "triton"

    def __init__(self, base_url: str = "http://127.0.0.1:8000", *, model: str = "ensemble",
                 flavor: str | None = None, **kw: Any):
        if flavor not in (*FLAVORS, None):
            raise ValueError(f"flavor must be one of {FLAVORS} or None (detect)")
        self.flavor = flavor
        self.inputs: frozenset[str] = frozenset()
        super().__init__(base_url, model=model, **kw)

    # -- detection ----------------------------------------------------------------------
    def _detect(self) -> tuple[str | None, Capabilities]:
        server = self.http.get("/v2", what="triton server metadata")
        version = server.get("version") if isinstance(server, Mapping) else None
        meta = self.http.get(f"/v2/models/{self.model}", what=f"triton model {self.model!r} metadata")
        self.inputs = frozenset(i["name"] for i in meta.get("inputs", []))
        outputs = {o["name"] for o in meta.get("outputs", [])}
        if "text_input" not in self.inputs or "text_output" not in outputs:
            raise BackendError(f"model {self.model!r} has no text_input/text_output: not an LLM model "
                               "for the generate endpoint", backend=self.name)
        if self.flavor is None:
            self.flavor = "vllm" if "sampling_parameters" in self.inputs else "tensorrtllm"
        return (str(version) if version else None), self._capabilities_for(version)

    def _capabilities_for(self, version: str | None) -> Capabilities:
        if self.flavor == "vllm":
            guided = "sampling_parameters" in self.inputs or not self.inputs
            sampling = frozenset(_VLLM_SAMPLING)
        else:
            guided = {"guided_decoding_guide_type", "guided_decoding_guide"} <= self.inputs or not self.inputs
            names = self.inputs or frozenset(_TRT_SAMPLING.values())
            sampling = frozenset(k for k, v in _TRT_SAMPLING.items() if v in names) | {"max_new_tokens",
                                                                                    "temperature"}
        return Capabilities(
            regex=guided, json_schema=guided, grammar=False, choices=guided,
            select="choice" if guided else "none", prefix_cache=False, tools=False, streaming=False,
            chat_messages=False, sampling=sampling)

    # -- translation ------------------------------------------------------------------
    def guide(self, spec: ConstraintSpec) -> tuple[str, str]:
        """(guide type, guide text) for the TensorRT-LLM flavour."""
        return GUIDES(spec, self)

    def translate(self, spec: ConstraintSpec) -> Any:
        """The flavour's translation of ``spec``; CapabilityError when it has none."""
        return GUIDED_DECODING(spec, self) if self.flavor == "vllm" else GUIDES(spec, self)

    def build_payload(self, request: GenerateRequest) -> dict[str, Any]:
        p = request.params
        caps = self.capabilities
        if self.flavor == "vllm":
            sp: dict[str, Any] = {}
            for name in p.set_fields() & caps.sampling:
                value = getattr(p, name)
                sp[_VLLM_SAMPLING[name]] = list(value) if isinstance(value, tuple) else value
            if request.constraint is not None:
                sp["guided_decoding"] = GUIDED_DECODING(request.constraint, self)
            return {"text_input": request.prompt, "stream": False, "exclude_input_in_output": True,
                    "sampling_parameters": json.dumps(sp)}
        payload: dict[str, Any] = {"text_input": request.prompt}
        for name in p.set_fields() & caps.sampling:
            value = getattr(p, name)
            payload[_TRT_SAMPLING[name]] = list(value) if isinstance(value, tuple) else value
        if "exclude_input_in_output" in self.inputs:
            payload["exclude_input_in_output"] = True
        if request.constraint is not None:
            kind, guide = self.guide(request.constraint)
            payload["guided_decoding_guide_type"] = kind
            payload["guided_decoding_guide"] = guide
        return payload

    def parse_generate(self, request: GenerateRequest, body: Mapping[str, Any]) -> GenerateResult:
        text = require(body, "text_output", backend=self.name)
        if isinstance(text, list) and len(text) == 1:  # a batch of one
            text = text[0]
        text = text_field(text, field="text_output", body=body, backend=self.name)
        if self.flavor == "tensorrtllm" and "exclude_input_in_output" not in self.inputs \
                and request.prompt and text.startswith(request.prompt):
            text = text[len(request.prompt):]  # older ensembles echo the prompt
        fr = body.get("finish_reason")
        if isinstance(fr, list):
            fr = fr[0] if fr else None
        return GenerateResult(text=text, finish_reason=finish_reason(fr),  # type: ignore[arg-type]
                              meta={"model_version": body.get("model_version")})

    def _generate_flow(self, request: GenerateRequest) -> Flow[GenerateResult]:
        body = yield Call(f"/v2/models/{self.model}/generate", self.build_payload(request),
                          what="triton generate")
        return self.parse_generate(request, body)

    def check_generate(self, request: GenerateRequest) -> None:
        super().check_generate(request)
        if request.constraint is not None:
            self.translate(request.constraint)  # untranslatable -> raise before sending


# -- constraint translation, one entry per kind (structgen.constraints.kind) -------------------


def _no_lark(spec: ConstraintSpec, backend: Any, what: str) -> CapabilityError:
    return CapabilityError(f"{spec.kind} constraints", backend=backend.name, version=backend.version,
                           hint="Triton's TensorRT-LLM backend takes EBNF (xgrammar), not Lark")


#: TensorRT-LLM flavour: spec class -> (``guided_decoding_guide_type``, ``guided_decoding_guide``)
GUIDES: Translations[tuple[str, str]] = Translations("triton tensorrtllm", missing=_no_lark)
#: vLLM flavour: spec class -> the ``guided_decoding`` object of ``sampling_parameters``
GUIDED_DECODING: Translations[dict[str, Any]] = Translations("triton vllm")


@GUIDES.register(JsonSchemaSpec)
def _json_guide(spec: JsonSchemaSpec, backend: TritonBackend) -> tuple[str, str]:
    return "json_schema", spec.schema


@GUIDES.register(RegexSpec)
def _regex_guide(spec: RegexSpec, backend: TritonBackend) -> tuple[str, str]:
    return "regex", spec.pattern


@GUIDES.register(ChoiceSpec)
def _choice_guide(spec: ChoiceSpec, backend: TritonBackend) -> tuple[str, str]:
    return "regex", choice_regex(spec.choices)


@GUIDED_DECODING.register(JsonSchemaSpec)
def _json_guided(spec: JsonSchemaSpec, backend: TritonBackend) -> dict[str, Any]:
    return {"json": spec.schema_dict}


@GUIDED_DECODING.register(RegexSpec)
def _regex_guided(spec: RegexSpec, backend: TritonBackend) -> dict[str, Any]:
    return {"regex": spec.pattern}


@GUIDED_DECODING.register(ChoiceSpec)
def _choice_guided(spec: ChoiceSpec, backend: TritonBackend) -> dict[str, Any]:
    return {"choice": list(spec.choices)}
