"""A scripted backend for unit-testing the interpreter. Never used to test a real backend."""

from structgen.backends.fake.backend import FakeBackend

__all__ = ["FakeBackend"]
