"""Scoring methods for ``select``: the three SGLang methods, scored by log-probabilities.

- ``token_length_normalized`` (default): highest mean token log-probability of the choice.
- ``greedy_token_selection``: compare choices token by token, keeping the best at each
  position; a shorter choice is padded with its own mean log-probability.
- ``unconditional_likelihood_normalized``: mean of (conditional - unconditional) token
  log-probabilities, which removes the bias towards choices that are likely anyway.

Each method is a callable object taking per-choice token log-probabilities and returning
the index of the chosen option plus meta information.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ChoicesDecision",
    "ChoicesSamplingMethod",
    "greedy_token_selection",
    "method_by_name",
    "token_length_normalized",
    "unconditional_likelihood_normalized",
]


@dataclass(frozen=True)
class ChoicesDecision:
    index: int
    meta_info: dict[str, Any]


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("-inf")


def _argmax_first(values: Sequence[float]) -> int:
    return max(range(len(values)), key=values.__getitem__)


class ChoicesSamplingMethod:
    name = "base"
    requires_unconditional_logprobs = False

    def __call__(self, *, choices: Sequence[str], token_logprobs: Sequence[Sequence[float]],
                 unconditional_token_logprobs: Sequence[Sequence[float]] | None = None) -> ChoicesDecision:
        raise NotImplementedError

    def __repr__(self) -> str:
        return self.name


class TokenLengthNormalized(ChoicesSamplingMethod):
    name = "token_length_normalized"

    def __call__(self, *, choices: Sequence[str], token_logprobs: Sequence[Sequence[float]],
                 unconditional_token_logprobs: Sequence[Sequence[float]] | None = None) -> ChoicesDecision:
        normalized = [_mean(lp) for lp in token_logprobs]
        return ChoicesDecision(_argmax_first(normalized), {
            "normalized_prompt_logprobs": normalized,
            "input_token_logprobs": [list(lp) for lp in token_logprobs]})


class GreedyTokenSelection(ChoicesSamplingMethod):
    name = "greedy_token_selection"

    def __call__(self, *, choices: Sequence[str], token_logprobs: Sequence[Sequence[float]],
                 unconditional_token_logprobs: Sequence[Sequence[float]] | None = None) -> ChoicesDecision:
        width = max((len(lp) for lp in token_logprobs), default=0)
        matrix = []
        for lp in token_logprobs:
            row = list(lp)
            row += [_mean(lp)] * (width - len(row))
            matrix.append(row)
        remaining = list(range(len(choices)))
        for j in range(width):
            best = max(matrix[i][j] for i in remaining)
            remaining = [i for i in remaining if matrix[i][j] == best]
            if len(remaining) == 1:
                break
        return ChoicesDecision(remaining[0], {
            "normalized_prompt_logprobs": [_mean(lp) for lp in token_logprobs],
            "input_token_logprobs": [list(lp) for lp in token_logprobs],
            "greedy_logprob_matrix": matrix})


class UnconditionalLikelihoodNormalized(ChoicesSamplingMethod):
    name = "unconditional_likelihood_normalized"
    requires_unconditional_logprobs = True

    def __call__(self, *, choices: Sequence[str], token_logprobs: Sequence[Sequence[float]],
                 unconditional_token_logprobs: Sequence[Sequence[float]] | None = None) -> ChoicesDecision:
        if unconditional_token_logprobs is None:
            raise ValueError("unconditional token logprobs are required for this method")
        scores = []
        for cond, uncond in zip(token_logprobs, unconditional_token_logprobs, strict=False):
            if len(cond) != len(uncond):
                raise ValueError("conditional and unconditional logprobs differ in length")
            scores.append(_mean([c - (u or 0.0) for c, u in zip(cond, uncond, strict=True)]))
        return ChoicesDecision(_argmax_first(scores), {
            "normalized_prompt_logprobs": [_mean(lp) for lp in token_logprobs],
            "input_token_logprobs": [list(lp) for lp in token_logprobs],
            "unconditional_token_logprobs": [list(lp) for lp in unconditional_token_logprobs],
            "normalized_unconditional_prompt_logprobs": scores})


token_length_normalized = TokenLengthNormalized()
greedy_token_selection = GreedyTokenSelection()
unconditional_likelihood_normalized = UnconditionalLikelihoodNormalized()

_BY_NAME = {m.name: m for m in (token_length_normalized, greedy_token_selection,
                                unconditional_likelihood_normalized)}


def method_by_name(method: Any) -> ChoicesSamplingMethod:
    """Accept a method object or its name."""
    if method is None:
        return token_length_normalized
    if isinstance(method, ChoicesSamplingMethod):
        return method
    if isinstance(method, str) and method in _BY_NAME:
        return _BY_NAME[method]
    from structgen.errors import ProgramError

    raise ProgramError(f"unknown choices_method {method!r}; use one of {sorted(_BY_NAME)}")
