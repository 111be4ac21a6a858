"""The balancer over several servers: least outstanding requests with prefix affinity.
(Scripted fake backends stand in for servers: this tests routing, not generation.)"""

from __future__ import annotations

import threading
import time
from collections import Counter

from structgen.backends.fake import FakeBackend
from structgen.contract.backend import GenerateRequest, GenerateResult
from structgen.extract.balance import Balancer


def _slow(delay: float, tag: str) -> FakeBackend:
    def respond(req: GenerateRequest) -> GenerateResult:
        time.sleep(delay)
        return GenerateResult(text=tag)

    return FakeBackend(responder=respond)


def test_groups_stick_to_their_server_when_load_is_even() -> None:
    bal = Balancer([FakeBackend(responder=lambda r: "x") for _ in range(4)], slack=8)
    for group in ("a", "b", "c", "d", "e", "f"):
        picks = {bal.pick(group) for _ in range(3)}
        for i in range(4):
            bal.outstanding[i] = 0
        assert len(picks) == 1  # a prefix group always lands on one server while load allows
    assert len({bal._preferred(g) for g in "abcdefghijklmnop"}) == 4  # and groups spread out


def test_overloaded_preferred_server_spills_to_the_least_loaded() -> None:
    bal = Balancer([FakeBackend(responder=lambda r: "x") for _ in range(3)], slack=2)
    pref = bal._preferred("g")
    chosen = [bal.pick("g") for _ in range(12)]  # nothing completes: outstanding only grows
    counts = Counter(chosen)
    assert counts[pref] >= 3 and len(counts) == 3
    assert max(bal.outstanding) - min(bal.outstanding) <= 2 + 1


def test_concurrent_requests_fill_every_server() -> None:
    backends = [_slow(0.05, f"s{i}") for i in range(3)]
    bal = Balancer(backends, slack=1)
    results: list[str] = []
    lock = threading.Lock()

    def one() -> None:
        (res,) = bal.generate([GenerateRequest(prompt="p", group="same-prefix")])
        assert isinstance(res, GenerateResult)
        with lock:
            results.append(res.text)

    threads = [threading.Thread(target=one) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 12 and set(results) == {"s0", "s1", "s2"}
    assert bal.outstanding == [0, 0, 0] and sum(bal.sent) == 12
