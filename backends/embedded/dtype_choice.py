"""``dtype="auto"`` on the CPU: bfloat16 only where it is measured to be faster than float32.

A CPU that lists a bf16 instruction set (AVX512-BF16, AMX) is not always faster in bf16:
on this project's 2-core Intel Xeon with AVX512-BF16 and no AMX, torch's bf16 matrix
products ran at 120-165 GFLOP/s and its float32 ones at 180-315 GFLOP/s (``[64..1024, 576]``
by SmolLM2-135M's weight shapes, ``F.linear``, oneDNN packed or not), and batch extraction
(``bench/extract.py --docs 500``) ran at 4.6-5.0 docs/s in bf16 against 6.4-6.7 in float32.
On an AMX CPU bf16 is several times faster; on a Zen 4 a bf16 forward was ~1.3x float32.
So ``auto`` asks the machine: where the CPU lists a bf16 instruction set it times one
product of :data:`PROBE_SHAPE` in each dtype (interleaved, best of :data:`PROBE_REPS`:
a few tens of milliseconds, once per process) and takes bf16 unless float32 runs faster
by more than :data:`MARGIN` (bf16 halves the memory of the weights and the KV cache, so a
tie goes to it). A CPU without a bf16 instruction set emulates it (3-4x slower on an
AVX2-only CPU): float32 there, not probed.

The probe times the kernels, not the machine's load: it runs them on one thread and reads
that thread's CPU time (``time.thread_time``). Timed by the wall clock with the process's
threads, it chose wrong whenever other processes held the cores while a model loaded --
as they do when a Ray worker loads its engine while Ray starts its own processes: with two
busy-looping processes beside it on the 2-core Xeon, wall-clock probes gave float32 34-80
GFLOP/s against bfloat16's 66-68 (bfloat16 chosen in 5 of 6 probes, a job then ~1.3x
slower), where one thread's CPU time gave a ratio of 1.53-1.67 (1.76 with the machine idle),
float32 every time.

The probe runs on the thread that will run the model (see :mod:`.compute_thread`).
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from structgen.backends.embedded.kernel_cache import bound_kernel_caches

__all__ = ["MARGIN", "PROBE_REPS", "PROBE_SHAPE", "DtypeChoice", "choose", "cpu_has_native_bf16", "pick_cpu_dtype",
           "probe_rates"]

log = logging.getLogger("structgen.embedded")

#: rows, inputs, outputs of the timed product: a batched decode step's layer of a small model
PROBE_SHAPE = (256, 1024, 1024)
#: timed products per dtype (after one warm-up each); the fastest counts
PROBE_REPS = 5
#: float32 must be this much faster than bf16 to be chosen (a tie keeps bf16's half memory)
MARGIN = 1.1


@dataclass(frozen=True)
class DtypeChoice:
    """What ``auto`` chose on this CPU, and why: the probe's rates (GFLOP/s; None: not
    probed, the CPU lists no bf16 instruction set)."""

    dtype: torch.dtype
    bf16_gflops: float | None = None
    fp32_gflops: float | None = None

    def describe(self) -> str:
        """One line for logs and benchmark output."""
        name = str(self.dtype).removeprefix("torch.")
        if self.bf16_gflops is None or self.fp32_gflops is None:
            return f"{name} (no bf16 instruction set)"
        rates = f"bfloat16 {self.bf16_gflops:.0f} GFLOP/s, float32 {self.fp32_gflops:.0f} GFLOP/s"
        return f"{name} (probe, one core: {rates})"


def cpu_has_native_bf16() -> bool:
    """Whether this CPU lists a bf16 instruction set (AVX512-BF16 or AMX) in ``/proc/cpuinfo``."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool(flags & {"avx512_bf16", "amx_bf16"})
    except OSError:
        pass
    return False


def choose(bf16_gflops: float, fp32_gflops: float, margin: float = MARGIN) -> torch.dtype:
    """bfloat16 unless float32 is more than ``margin`` times as fast."""
    return torch.float32 if fp32_gflops > margin * bf16_gflops else torch.bfloat16


def probe_rates(shape: tuple[int, int, int] = PROBE_SHAPE, reps: int = PROBE_REPS) -> tuple[float, float]:
    """GFLOP/s of one core running one ``[m, k] x [k, n]`` product in bfloat16 and in float32
    on this thread: torch held to one thread, each product timed by this thread's CPU time
    (other processes taking the cores do not count), best of ``reps``, the two dtypes
    interleaved."""
    m, k, n = shape
    gen = torch.Generator().manual_seed(0)
    x32, w32 = torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen)
    pairs = {torch.bfloat16: (x32.to(torch.bfloat16), w32.to(torch.bfloat16)), torch.float32: (x32, w32)}
    best = dict.fromkeys(pairs, float("inf"))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            for x, w in pairs.values():  # warm-up: oneDNN compiles its bf16 kernel here
                F.linear(x, w)
            for _ in range(reps):
                for dt, (x, w) in pairs.items():
                    t = time.thread_time()
                    F.linear(x, w)
                    best[dt] = min(best[dt], time.thread_time() - t)
    finally:
        torch.set_num_threads(threads)
    flops = 2.0 * m * k * n / 1e9
    return flops / max(best[torch.bfloat16], 1e-9), flops / max(best[torch.float32], 1e-9)


@functools.lru_cache(maxsize=1)
def pick_cpu_dtype() -> DtypeChoice:
    """``auto``'s dtype on this CPU (measured once per process; call it on the model's thread)."""
    if not cpu_has_native_bf16():
        choice = DtypeChoice(torch.float32)
    else:
        bound_kernel_caches()  # before the process's first bf16 kernel (the probe's): see kernel_cache
        bf16, fp32 = probe_rates()
        choice = DtypeChoice(choose(bf16, fp32), bf16_gflops=bf16, fp32_gflops=fp32)
    log.info("dtype auto: %s", choice.describe())
    return choice
