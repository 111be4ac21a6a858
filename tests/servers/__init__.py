"""Helpers that start engine servers on 127.0.0.1 for the server tests (marked ``server``)."""
