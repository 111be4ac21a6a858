"""Triton Inference Server backend (generate endpoint; TensorRT-LLM or vLLM model flavour)."""

from structgen.backends.triton.adapter import TritonBackend

__all__ = ["TritonBackend"]
