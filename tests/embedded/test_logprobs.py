"""Log-probabilities under a constraint: the model's own (``output_token_logprobs``) and the
constrained distribution's (``output_token_constrained_logprobs``, renormalised over the
tokens the mask allowed), which per-field confidence reads."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from structgen.backends.embedded.sampler import TokenMask, masked_logprob
from structgen.constraints.spec import json_schema_spec, regex_spec
from structgen.contract.backend import GenerateRequest, SamplingParams
from structgen.extract.confidence import confidence_entries


def _raw(seed: int = 0, vocab: int = 50) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.log_softmax(torch.randn(vocab, generator=g) * 3, dim=-1)


@pytest.mark.parametrize("allowed", [[7], [3, 9, 11], list(range(0, 50, 2))])
def test_masked_logprob_is_the_renormalised_distribution(allowed: list[int]) -> None:
    raw = _raw()
    expected = torch.log_softmax(raw[allowed], dim=-1)
    idx = np.array(allowed)
    rest = np.array([t for t in range(raw.numel()) if t not in allowed])
    for i, tok in enumerate(allowed):
        by_allowed = masked_logprob(raw, TokenMask(allowed=idx), tok)
        by_disallowed = masked_logprob(raw, TokenMask(disallowed=rest), tok)
        assert by_allowed == pytest.approx(float(expected[i]), abs=1e-5)
        assert by_disallowed == pytest.approx(float(expected[i]), abs=1e-5)
        assert float(raw[tok]) <= by_allowed + 1e-6 <= 1e-6
    if len(allowed) == 1:  # a forced token is certain
        assert masked_logprob(raw, TokenMask(allowed=idx), allowed[0]) == pytest.approx(0.0, abs=1e-6)


@pytest.mark.model
def test_a_constrained_decode_reports_both_and_confidence_reads_the_constrained(embedded_backend) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"], "additionalProperties": False}
    params = SamplingParams(max_new_tokens=40, return_logprob=True, return_text_in_logprobs=True)
    constrained, free, digits = embedded_backend.generate([
        GenerateRequest(prompt="Ada is 36. As JSON: ", params=params, constraint=json_schema_spec(schema)),
        GenerateRequest(prompt="Ada is 36. As JSON: ", params=params),
        GenerateRequest(prompt="Pick: ", params=params, constraint=regex_spec("(yes|no)")),
    ])
    for res in (constrained, digits):
        raw = res.meta["output_token_logprobs"]
        masked = res.meta["output_token_constrained_logprobs"]
        assert len(masked) == len(raw) == res.meta["completion_tokens"]
        for (lp, _tok, _text), mlp in zip(raw, masked, strict=True):
            assert lp <= mlp + 1e-5 and mlp <= 1e-5  # a subset's renormalisation raises it, never above 1
        assert any(mlp > lp + 1e-3 for (lp, _t, _x), mlp in zip(raw, masked, strict=True))  # the mask mattered
        entries = confidence_entries(res.meta)
        assert [e[0] for e in entries] == masked and [e[1:] for e in entries] == [tuple(e[1:]) for e in raw]
    assert "output_token_constrained_logprobs" not in free.meta  # nothing was masked
    assert confidence_entries(free.meta) == list(free.meta["output_token_logprobs"])
    assert math.isfinite(sum(e[0] for e in confidence_entries(constrained.meta)))
