"""The embedded backend takes any local HF directory, a .gguf file, or a hub id."""

from __future__ import annotations

import re

import pytest

import structgen as sg
from structgen.backends.embedded.loader import default_gguf_path, resolve_model_dir

pytestmark = pytest.mark.model


def test_a_local_hf_directory_runs_constrained_programs():
    from structgen.backends.embedded import EmbeddedBackend
    from tests.servers.tinymodel import build_tiny_llama

    path = build_tiny_llama()  # random weights: the constraint must hold whatever they are
    backend = EmbeddedBackend(str(path))
    try:
        @sg.program
        def p(s):
            s += "Date: " + sg.gen("d", regex=r"\d{4}-\d{2}-\d{2}", max_tokens=16)
            s += " Label: " + sg.select("c", ["alpha", "beta"])

        st = p.run(backend=backend)
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", st["d"]) and st["c"] in ("alpha", "beta")
        assert backend.stats()["forward_passes"] > 0  # the batched engine served it
    finally:
        backend.close()


def test_gguf_paths_convert_once_and_hub_ids_pass_through(tmp_path):
    gguf = default_gguf_path()
    assert resolve_model_dir(str(gguf)) == resolve_model_dir(None)  # same cached conversion
    assert resolve_model_dir("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    with pytest.raises(sg.BackendError, match="model file not found"):
        resolve_model_dir(str(tmp_path / "missing.gguf"))
