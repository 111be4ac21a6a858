"""The embedded engine runs all of its torch work on one thread, model loading included
(backends/embedded/compute_thread.py: a second thread running torch kernels makes libgomp
wake its workers through the kernel on every op)."""

from __future__ import annotations

import threading

import pytest

from structgen.backends.embedded.compute_thread import ComputeThread


def test_callables_run_in_order_on_one_thread_and_their_errors_reach_the_caller():
    ct = ComputeThread(num_threads=1)
    try:
        seen: list[tuple[int, threading.Thread]] = []
        futs = [ct.submit(lambda i=i: seen.append((i, threading.current_thread())) or i) for i in range(5)]
        assert [f.result(timeout=10) for f in futs] == list(range(5))
        assert [i for i, _ in seen] == list(range(5))
        assert len({t for _, t in seen}) == 1 and seen[0][1] is not threading.current_thread()
        with pytest.raises(ZeroDivisionError):
            ct.call(lambda: 1 / 0)
        assert ct.call(lambda: ct.call(lambda: "inline")) == "inline"  # a call from the thread runs at once
        assert ct.call(threading.current_thread) is seen[0][1]  # still the same thread after an error
    finally:
        ct.stop()
    assert not ct.alive


def test_the_thread_takes_the_creators_torch_thread_count():
    torch = pytest.importorskip("torch")
    ct = ComputeThread(num_threads=1)
    try:
        assert ct.call(torch.get_num_threads) == 1
    finally:
        ct.stop()
    before = torch.get_num_threads()
    ct = ComputeThread()
    try:
        assert ct.num_threads == before and ct.call(torch.get_num_threads) == before
    finally:
        ct.stop()


@pytest.mark.model
def test_the_backend_loads_its_model_and_decodes_on_the_engine_thread(monkeypatch):
    from structgen.backends.embedded import EmbeddedBackend, adapter
    from structgen.backends.embedded.model import DecoderModel
    from structgen.contract.backend import GenerateRequest, SamplingParams

    threads: dict[str, set[threading.Thread]] = {"load": set(), "forward": set()}
    real_load, real_forward = adapter.load_model, DecoderModel.forward

    def load(*a, **k):
        threads["load"].add(threading.current_thread())
        return real_load(*a, **k)

    def forward(self, *a, **k):
        threads["forward"].add(threading.current_thread())
        return real_forward(self, *a, **k)

    monkeypatch.setattr(adapter, "load_model", load)
    monkeypatch.setattr(DecoderModel, "forward", forward)
    be = EmbeddedBackend()
    try:
        [out] = be.generate([GenerateRequest("Hello", SamplingParams(max_new_tokens=3))])
        assert isinstance(out.text, str)
        assert len(threads["load"]) == 1 and threads["load"] == threads["forward"]
        assert threading.current_thread() not in threads["load"]
        engine_thread = next(iter(threads["load"]))
    finally:
        be.close()
    engine_thread.join(timeout=10)
    assert not engine_thread.is_alive()  # close ends it
