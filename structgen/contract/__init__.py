"""The backend contract: what a backend implements and what it is handed.

* :mod:`.backend` -- the :class:`Backend` ABC, its declared :class:`Capabilities`, and the
  frozen request / result data (:class:`GenerateRequest`, :class:`SelectRequest`, ...).
* :mod:`.chat_template` -- role rendering from a tokenizer's own chat template.
* :mod:`.registry` -- backends found through the ``structgen.backends`` entry points.
* :mod:`.server` and :mod:`.http` -- the base for HTTP engine adapters: sans-I/O request
  flows driven sync or async, a deadline per request, retries, a response-size cap
  (:mod:`.http_config`), error mapping (:mod:`.http_errors`), response reading
  (:mod:`.responses`). Import them explicitly: they need ``httpx``.

Third-party backends subclass :class:`Backend` (or :class:`~.server.ServerBackend`) and
register an entry point; see ``backends/README.md``.
"""

from structgen.contract.backend import (
    Backend,
    Capabilities,
    GenerateRequest,
    GenerateResult,
    Message,
    SamplingParams,
    SelectRequest,
    SelectResult,
    TextCallback,
)
from structgen.contract.chat_template import ChatTemplate, RoleText
from structgen.contract.registry import (
    available_backends,
    get_backend,
    get_default_backend,
    set_default_backend,
)

__all__ = [
    "Backend",
    "Capabilities",
    "ChatTemplate",
    "GenerateRequest",
    "GenerateResult",
    "Message",
    "RoleText",
    "SamplingParams",
    "SelectRequest",
    "SelectResult",
    "TextCallback",
    "available_backends",
    "get_backend",
    "get_default_backend",
    "set_default_backend",
]
