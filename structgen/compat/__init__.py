"""Compatibility with other frontends' spellings (SGLang), kept apart from structgen's own API."""
