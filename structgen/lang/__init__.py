"""SGLang-compatible module paths (``sglang.lang.*``) for programs that import them."""
