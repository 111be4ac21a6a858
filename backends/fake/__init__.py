"""A scripted backend for unit-testing the interpreter. Never used to test a real backend."""

from structgen.backends.fake.adapter import FakeBackend

__all__ = ["FakeBackend"]
