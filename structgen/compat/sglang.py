"""SGLang frontend compatibility: what lets ``import structgen as sgl`` run SGLang scripts.

The DSL itself (``function``, ``gen``, ``select``, roles, ``fork``, ``run_batch``) has
SGLang's names and signatures and lives in :mod:`structgen.lang`, whose module paths
mirror SGLang's: ``sglang.lang.ir`` (the dtype regexes) is :mod:`structgen.lang.ir`,
``sglang.lang.choices`` (select scoring methods) is :mod:`structgen.lang.choices`.

This module maps the setup lines at the top of an SGLang script to structgen backends,
with SGLang's argument names (exported from ``structgen``):

- ``RuntimeEndpoint(base_url, api_key=...)``: the SGLang adapter on that server;
- ``OpenAI(model_name, base_url=..., api_key=...)``: the OpenAI-compatible (chat) adapter;
- ``Runtime(model_path=..., dtype=...)``: the embedded backend, in process;
- ``set_default_backend(b)``: :func:`structgen.set_default_backend`;
- ``flush_cache()`` / ``get_server_info()``: the backend's prefix cache / its description;
- ``Engine``, ``Anthropic``, ``LiteLLM``, ``VertexAI``: no equivalent, a clear error naming
  what to use instead.

Nothing here imports httpx or torch until a constructor is called.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import asdict
from typing import Any, NoReturn

from structgen.contract.backend import Backend
from structgen.contract.registry import get_default_backend
from structgen.errors import BackendError

__all__ = [
    "Anthropic",
    "Engine",
    "LiteLLM",
    "OpenAI",
    "Runtime",
    "RuntimeEndpoint",
    "VertexAI",
    "flush_cache",
    "get_server_args",
    "get_server_info",
]

#: SGLang's non-chat OpenAI models (its INSTRUCT_MODEL_NAMES)
_COMPLETION_MODELS = frozenset({"gpt-3.5-turbo-instruct"})
#: SGLang ServerArgs dtype -> the embedded backend's dtype
_DTYPES: dict[str, str | None] = {"auto": None, "half": "float16", "float16": "float16",
                                  "bfloat16": "bfloat16", "float": "float32", "float32": "float32"}


def RuntimeEndpoint(base_url: str, api_key: str | None = None, verify: str | bool | None = None,
                    chat_template_name: str | None = None) -> Backend:
    """An SGLang server (``python -m sglang.launch_server``): structgen's SGLang adapter.

    Roles are rendered with the served model's own chat template (read from the server's
    tokenizer path when it is a local directory); ``chat_template_name`` is not used.
    """
    if verify not in (None, True):
        raise BackendError(f"RuntimeEndpoint(verify={verify!r}): structgen verifies TLS certificates "
                           "with the system's store; a custom CA bundle or verify=False is not supported",
                           backend="sglang")
    if chat_template_name is not None:
        warnings.warn(f"RuntimeEndpoint(chat_template_name={chat_template_name!r}) is ignored: structgen "
                      "renders roles with the served model's own chat template", stacklevel=2)
    from structgen.backends.sglang import SGLangBackend

    return SGLangBackend(base_url, api_key=api_key)


def OpenAI(model_name: str, is_chat_model: bool | None = None, chat_template: Any = None,
           is_azure: bool = False, *args: Any, **kwargs: Any) -> Backend:
    """An OpenAI-compatible chat server: structgen's OpenAI adapter, with SGLang's (and the
    ``openai`` client's) argument names: ``base_url`` (``.../v1`` or the server root;
    default ``$OPENAI_BASE_URL`` or OpenAI's), ``api_key`` (default ``$OPENAI_API_KEY``),
    ``timeout``, ``max_retries``. Roles travel as chat messages (``chat_template`` unused)."""
    if args:
        raise BackendError("OpenAI(...) takes the openai client's options by name (base_url=..., "
                           "api_key=...), not positionally", backend="openai")
    if is_azure:
        raise BackendError("Azure OpenAI has no structgen backend: use OpenAI(model, base_url=<an "
                           "OpenAI-compatible /v1 URL>, api_key=...)", backend="openai")
    if is_chat_model is False or (is_chat_model is None and model_name in _COMPLETION_MODELS):
        raise BackendError(f"{model_name!r} is a completions (non-chat) model: structgen's OpenAI backend "
                           "speaks the chat route; serve the model with vLLM and use VLLMBackend "
                           "(the /v1/completions route)", backend="openai")
    options = dict(kwargs)
    base_url = str(options.pop("base_url", None) or os.environ.get("OPENAI_BASE_URL")
                   or "https://api.openai.com/v1").rstrip("/")
    if base_url.endswith("/v1"):  # the openai client's base_url includes /v1; the adapter adds it
        base_url = base_url[:-3]
    api_key = options.pop("api_key", None) or os.environ.get("OPENAI_API_KEY")
    mapped: dict[str, Any] = {}
    timeout = options.pop("timeout", None)
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        mapped["timeout"] = float(timeout)
    elif timeout is not None:
        raise BackendError(f"OpenAI(timeout={timeout!r}): give the timeout in seconds", backend="openai")
    if "max_retries" in options:
        mapped["max_retries"] = options.pop("max_retries")
    if options:
        raise BackendError(f"OpenAI(...) options {sorted(options)} are not supported by structgen's "
                           "OpenAI backend (it takes base_url, api_key, timeout, max_retries)",
                           backend="openai")
    from structgen.backends.openai import OpenAIBackend

    return OpenAIBackend(base_url, model=model_name, api_key=api_key, **mapped)


def Runtime(*args: Any, model_path: str | None = None, dtype: str = "auto", device: str | None = None,
            **server_args: Any) -> Backend:
    """SGLang's in-process server for a local model: structgen's embedded backend (the model
    runs in this process). ``shutdown()`` closes it. Server tuning arguments (ports, memory
    fractions, parallelism...) have no meaning here and are ignored with a warning."""
    if args:
        raise BackendError("Runtime(...) takes its server arguments by name (model_path=...)",
                           backend="embedded")
    if dtype not in _DTYPES:
        raise BackendError(f"Runtime(dtype={dtype!r}): use one of {sorted(_DTYPES)}", backend="embedded")
    ignored = sorted(k for k in server_args if k not in ("log_level", "launch_timeout", "tokenizer_path"))
    if ignored:
        warnings.warn(f"Runtime(...) arguments {ignored} are ignored: the model runs in process on "
                      "structgen's embedded engine", stacklevel=2)
    from structgen.backends.embedded import EmbeddedBackend

    class _Runtime(EmbeddedBackend):  # type: ignore[misc]  # backends are not type-checked here
        """The embedded backend with SGLang Runtime's methods."""

        def shutdown(self) -> None:
            self.close()

        def cache_prefix(self, prefix: str) -> None:
            self.warm(prefix)

        def get_tokenizer(self) -> Any:
            return self.tokenizer

    options: dict[str, Any] = {"dtype": _DTYPES[dtype]}
    if device is not None:
        options["device"] = device
    return _Runtime(model_path, **options)


def _unsupported(name: str, instead: str) -> NoReturn:
    raise BackendError(f"SGLang's {name} has no structgen equivalent; {instead}", backend=name)


def Engine(*args: Any, **kwargs: Any) -> NoReturn:
    """SGLang's offline engine API (``llm.generate(prompts, sampling_params)``): not provided."""
    _unsupported("Engine", "write a program and run it with Runtime(model_path=...) (the embedded "
                           "backend, in process) or run_batch for many inputs")


def Anthropic(*args: Any, **kwargs: Any) -> NoReturn:
    """Anthropic's API: not provided."""
    _unsupported("Anthropic", "use OpenAI(model, base_url=..., api_key=...) with an OpenAI-compatible "
                              "server, or RuntimeEndpoint(url) with an SGLang server")


def LiteLLM(*args: Any, **kwargs: Any) -> NoReturn:
    """LiteLLM (in-process provider calls): not provided."""
    _unsupported("LiteLLM", "start a LiteLLM proxy and use OpenAI(model, base_url=<proxy>/v1, api_key=...)")


def VertexAI(*args: Any, **kwargs: Any) -> NoReturn:
    """Google Vertex AI: not provided."""
    _unsupported("VertexAI", "use OpenAI(model, base_url=..., api_key=...) with Vertex AI's "
                             "OpenAI-compatible endpoint, or another OpenAI-compatible server")


def flush_cache(backend: Backend | None = None) -> bool:
    """Empty the backend's prefix cache (the default backend's if none is given); False
    when it keeps none that can be flushed."""
    be = backend if backend is not None else get_default_backend()
    clear = getattr(be, "clear_prefix_cache", None)
    if callable(clear):
        clear()
        return True
    http = getattr(be, "http", None)
    if getattr(be, "name", None) == "sglang" and http is not None:
        http.request("POST", "/flush_cache", {}, what="sglang flush cache")
        return True
    return False


def get_server_info(backend: Backend | None = None) -> dict[str, Any]:
    """The SGLang server's own info for an SGLang backend; otherwise the backend's name,
    version, capabilities and counters."""
    be = backend if backend is not None else get_default_backend()
    http = getattr(be, "http", None)
    if getattr(be, "name", None) == "sglang" and http is not None:
        return dict(http.get("/get_server_info", what="sglang server info"))
    caps = asdict(be.capabilities)
    caps["sampling"] = sorted(caps["sampling"])
    return {"backend": be.name, "version": be.version, "capabilities": caps, "stats": dict(be.stats())}


get_server_args = get_server_info  # SGLang's older name
