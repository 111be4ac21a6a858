"""structgen: structured LLM programs."""
