"""Any OpenAI-compatible server: chat route, ``response_format`` json_schema (strict)."""

from structgen.backends.openai.adapter import OpenAIBackend, OpenAICompatBackend

__all__ = ["OpenAIBackend", "OpenAICompatBackend"]
