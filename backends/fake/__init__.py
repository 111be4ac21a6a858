"""A scripted backend for unit-testing the interpreter (never for testing real backends)."""
