"""``sglang.lang.choices`` compatibility: the select scoring methods."""

from structgen.choices import (
    ChoicesDecision,
    ChoicesSamplingMethod,
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)

__all__ = [
    "ChoicesDecision",
    "ChoicesSamplingMethod",
    "greedy_token_selection",
    "token_length_normalized",
    "unconditional_likelihood_normalized",
]
