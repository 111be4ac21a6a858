"""vLLM server backend (OpenAI-compatible routes, ``structured_outputs``, prompt logprobs)."""

from structgen.backends.vllm.adapter import VLLMBackend

__all__ = ["VLLMBackend"]
