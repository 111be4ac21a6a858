"""llama.cpp server backend (``llama-server``): GBNF grammars, validated outputs."""

from structgen.backends.llamacpp.adapter import LlamaCppBackend

__all__ = ["LlamaCppBackend"]
