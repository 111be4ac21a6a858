"""SGLang runtime backend (native ``/generate``). Unverified against a live engine here."""

from structgen.backends.sglang.adapter import SGLangBackend

__all__ = ["SGLangBackend"]
