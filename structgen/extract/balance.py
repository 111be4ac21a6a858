"""Many engine servers as one backend: least outstanding requests, with prefix affinity.

:class:`Balancer` sends each request to one of its backends. Requests of one prefix group
(the same instructions, few-shot examples and schema: ``GenerateRequest.group``) prefer
the same server -- chosen by rendezvous hashing, so the choice is stable and spreads
groups evenly -- so that server's prefix cache keeps hitting. The preference holds only
while that server has at most ``slack`` more requests in flight than the least loaded
one; past that the request goes to the least loaded server (which then caches the prefix
too). With one group and many servers this fills every server; with many groups each
stays where its prefix is cached.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from structgen.contract.backend import (
    Backend,
    GenerateRequest,
    GenerateResult,
    SelectRequest,
    SelectResult,
    TextCallback,
)
from structgen.contract.chat_template import ChatTemplate
from structgen.errors import BackendError, StructgenError

__all__ = ["Balancer"]


class Balancer(Backend):
    name = "balancer"

    def __init__(self, backends: Sequence[Backend], *, slack: int = 8):
        if not backends:
            raise BackendError("a balancer needs at least one backend", backend="balancer")
        self.backends = list(backends)
        self.slack = slack
        self.capabilities = self.backends[0].capabilities
        self.name = f"balancer[{self.backends[0].name} x{len(self.backends)}]"
        self.outstanding = [0] * len(self.backends)
        self.sent = [0] * len(self.backends)
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max(4, 4 * len(self.backends)), thread_name_prefix="structgen-balance")
        self.model = getattr(self.backends[0], "model", None)

    # -- routing ----------------------------------------------------------------------------
    def _preferred(self, group: str | None) -> int:
        if group is None or len(self.backends) == 1:
            return 0
        scores = [hashlib.sha256(f"{i}|{group}".encode()).digest() for i in range(len(self.backends))]
        return max(range(len(scores)), key=scores.__getitem__)

    def pick(self, group: str | None) -> int:
        """Choose a backend for one request of ``group`` and count it as outstanding."""
        with self._lock:
            least = min(range(len(self.backends)), key=self.outstanding.__getitem__)
            pref = self._preferred(group)
            i = pref if self.outstanding[pref] <= self.outstanding[least] + self.slack else least
            self.outstanding[i] += 1
            self.sent[i] += 1
            return i

    def _done(self, i: int) -> None:
        with self._lock:
            self.outstanding[i] -= 1

    def _one(self, request: GenerateRequest) -> GenerateResult | StructgenError:
        i = self.pick(request.group)
        try:
            out = self.backends[i].generate([request])[0]
        except StructgenError as exc:
            out = exc
        finally:
            self._done(i)
        if isinstance(out, GenerateResult):
            out.meta.setdefault("server", i)
        return out

    # -- the backend contract -----------------------------------------------------------------
    def generate(self, requests: Sequence[GenerateRequest], *,
                 on_text: TextCallback | None = None) -> list[GenerateResult | StructgenError]:
        if len(requests) == 1:
            return [self._one(requests[0])]
        return list(self._pool.map(self._one, requests))

    def select(self, requests: Sequence[SelectRequest]) -> list[SelectResult | StructgenError]:
        out: list[SelectResult | StructgenError] = []
        for r in requests:
            i = self.pick(r.group)
            try:
                out.append(self.backends[i].select([r])[0])
            finally:
                self._done(i)
        return out

    def chat_template(self) -> ChatTemplate | None:
        return self.backends[0].chat_template()

    def warm(self, prefix: str) -> None:
        for b in self.backends:
            b.warm(prefix)

    def stats(self) -> Mapping[str, Any]:
        return {"sent": list(self.sent), "outstanding": list(self.outstanding),
                "backends": [dict(b.stats()) for b in self.backends]}

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for b in self.backends:
            b.close()
