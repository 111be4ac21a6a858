"""TensorRT-LLM ``trtllm-serve`` backend. Unverified against a live engine here."""

from structgen.backends.trtllm.adapter import TRTLLMBackend, llm_api_guided_kwargs

__all__ = ["TRTLLMBackend", "llm_api_guided_kwargs"]
