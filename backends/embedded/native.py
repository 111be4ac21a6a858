"""Fused CPU kernels for the embedded forward, compiled at first use (``cpu_kernels.c``).

Why: in bfloat16 on a CPU with AMX the matrix products stopped being most of a decode
step. A step of 256 sequences (SmolLM2-135M, ``torch.profiler``) spent about as long in
attention over each sequence's own keys (gathered out of the KV pool, then torch's fused
CPU attention on ``[256, 3, 3, 64]`` queries: about 2 us of fixed cost per sequence and
head) and in small elementwise ops (RMSNorm alone is eight, run 61 times a forward) as in
the products. These kernels read each sequence's keys in place through its slot index
(no gather), for one-token queries and for short runs of new tokens (a prompt's uncached
tail), and do RMSNorm (with the residual add), SiLU-times-up and RoPE in one pass each.
Measured alone (bf16, 2 cores): attention of 256 one-token queries over their own 40-61
keys 0.65 ms against 1.9 ms gathered + torch's kernel; 112 prompt tails of 38 tokens 3.9
ms against 7.5 ms; RMSNorm of ``[256, 576]`` 0.035 ms against 0.074 ms (with the residual
add 0.048 against 0.097), RoPE 0.032 against 0.078 ms; SiLU-times-up the same as torch. A
decode step of 256 sequences: 145 ms against 165 ms (median of six alternating runs).
Where the CPU has AVX-512 BF16 (``Kernels.bf16_attention``), bfloat16 heads of head_dim 64
take a second attention loop built on ``vdpbf16ps`` with an online softmax, and each
sequence's keys are prefetched while the one before it computes: that call 0.43 ms against
0.77 (keys in cache), 0.86 against 1.56 ms with the keys spread over 30 layers' pools, and the
in-process extract job (500 documents a round, four rounds each, alternating) 24.35 docs/s
against 21.48 (median), 1.13x, on rounds that drifted from 25 to 13 docs/s; the full
benchmark's ratio to vLLM moved less, from 1.39-1.47 to 1.44-1.48 (``bench/extract.py``).
Where the CPU has AMX-BF16 (``Kernels.amx_attention``), the cascade's shared prefix (every
decode query against the same keys, torch's fused attention until then, 13% of the job)
runs on AMX tiles: scores by tile products, a base-2 softmax in AVX-512, weights times
values by tile products, merged into the own keys' result in the same pass: 0.26 ms a call
against 0.54-0.85 ms (256 rows, 9 heads over 3, 389 keys), and the in-process job 1.064x
(median of four alternating rounds of 500 documents each way). With AVX-512 BF16, RMSNorm
and SiLU-times-up of bfloat16 rows run an explicit AVX-512 loop (the generic one compiled to
about 3 cycles an element): ``[4096, 576]`` with the residual add 0.48 ms against 0.69,
SiLU-times-up of ``[4096, 2 x 1536]`` 2.25 ms against 2.83 (then bound by the cache's
bandwidth). The new tokens' K/V go to the pool by one copy (``kv_write_``).

How: ``cpu_kernels.c`` is compiled with the machine's C compiler (``$CC``, else ``cc``;
``-O3 -march=native -fopenmp``) into ``<cache>/kernels/cpu_kernels-<key>.so`` (``<cache>``:
:func:`~structgen.backends.embedded.model_cache.cache_root`), the key hashing the source,
the flags, the compiler's version and the CPU's feature flags (a cache shared by machines of
different kinds builds one library per kind). It is loaded with ctypes after torch, so its
OpenMP regions run on torch's own thread team (the process has one ``libgomp.so.1``:
torch's). Where torch's OpenMP runtime goes by another name (a wheel that renamed it), the
library would bring a second team, whose waiting threads slow torch's kernels (a first
version that ran threads of its own: a matmul and its attention kernel took 3.6 ms one
after the other against 2.2 ms for the two alone); the kernels are then not used. Built
once per machine kind; a build takes about a second.

Where it cannot be built or loaded (no compiler, an unsupported platform) or
``STRUCTGEN_NATIVE_KERNELS=0`` is set, :func:`kernels` returns None and the model runs its
torch code, as before; the reason is logged once. Results agree with the torch code to the
storage dtype's rounding (tested against it): the kernels compute in float32 and round
each op's result as torch does, except RoPE (rounded once) and the order of the sums.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

import torch

from structgen.backends.embedded.model_cache import cache_root

__all__ = ["ENV", "Kernels", "build", "kernels"]

log = logging.getLogger("structgen.embedded")

#: set to 0 to run the torch code instead
ENV = "STRUCTGEN_NATIVE_KERNELS"
SOURCE = Path(__file__).with_name("cpu_kernels.c")
FLAGS = ("-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=c11",
         # vectorised float sums (reassociation) but IEEE infinities and NaNs kept
         "-fno-math-errno", "-fno-trapping-math", "-fno-signed-zeros", "-fassociative-math")
MAX_HEAD_DIM = 256  # cpu_kernels.c's MAX_D
MAX_GROUP = 16      # and MAX_G
MAX_SHARED = 16384  # and SG_MAX_SHARED: the most prefix keys sg_shared_attn_bf16 takes
_ABI = 5

_VP = ctypes.c_void_p
_I, _L, _F = ctypes.c_int, ctypes.c_long, ctypes.c_float
_SUFFIX = {torch.float32: "f32", torch.bfloat16: "bf16"}


def _ptr(t: torch.Tensor) -> ctypes.c_void_p:
    return _VP(t.data_ptr())


class Kernels:
    """The loaded library's kernels, taking torch tensors (CPU, float32 or bfloat16)."""

    dtypes = tuple(_SUFFIX)

    def __init__(self, lib: ctypes.CDLL, path: Path) -> None:
        self.path = path
        #: what cpu_kernels.c compiled in here (bit 0: AVX-512 BF16, bit 1: AMX-BF16)
        self.features = features = int(lib.sg_features())
        #: the AVX-512 BF16 attention of bfloat16 heads of head_dim 64 is compiled in (the
        #: CPU has AVX-512 BF16); other heads, and every head elsewhere, run the generic loop
        self.bf16_attention = bool(features & 1)
        #: the AMX-BF16 attention to a shared prefix (:meth:`shared_attention_`) is compiled in
        #: (the CPU has AMX-BF16) and the kernel lends this process the tile state
        self.amx_attention = bool(features & 2) and lib.sg_amx_init() == 0
        self._shared = lib.sg_shared_attn_bf16
        self._shared.argtypes = [_VP] * 4 + [_I] * 5 + [_F, _I, _VP, _VP]
        self._shared.restype = _I
        self._kv_write = lib.sg_kv_write
        self._kv_write.argtypes = [_VP] * 5 + [_L] * 5
        self._kv_write.restype = _I
        self._fn: dict[tuple[str, torch.dtype], Any] = {}  # ctypes functions
        for dtype, suf in _SUFFIX.items():
            attn = getattr(lib, f"sg_decode_attn_{suf}")
            attn.argtypes = [_VP] * 5 + [_I] * 5 + [_F, _VP, _VP]
            attn.restype = _I
            chunk = getattr(lib, f"sg_chunk_attn_{suf}")
            chunk.argtypes = [_VP] * 7 + [_I] * 7 + [_F, _VP, _VP]
            chunk.restype = _I
            rms = getattr(lib, f"sg_rms_norm_{suf}")
            rms.argtypes = [_VP] * 4 + [_L, _I, _F]
            rms.restype = None
            silu = getattr(lib, f"sg_silu_mul_{suf}")
            silu.argtypes = [_VP, _VP, _L, _I]
            silu.restype = None
            rope = getattr(lib, f"sg_rope_{suf}")
            rope.argtypes = [_VP, _L, _VP, _VP, _L, _I, _I]
            rope.restype = None
            self._fn.update({("attn", dtype): attn, ("chunk", dtype): chunk, ("rms", dtype): rms,
                             ("silu", dtype): silu, ("rope", dtype): rope})

    def decode_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         index: torch.Tensor, lens: torch.Tensor, scale: float
                         ) -> tuple[torch.Tensor, torch.Tensor]:
        """One query per sequence against its own keys, read in place: ``q`` ``[B, H, D]``,
        ``k``/``v`` one layer of the pool ``[slots, KV, D]``, ``index`` ``[B, L]`` (int64;
        row ``b``'s first ``lens[b]`` entries are its slots), ``lens`` ``[B]`` (int32, each
        1..L). Returns the output ``[B, H, D]`` and the log-sum-exp ``[B, H]`` (float32), as
        :func:`~structgen.backends.embedded.attention.attend_padded` over the gathered keys."""
        b, h, d = q.shape
        kv = k.shape[1]
        q = q.contiguous()
        _check(q, k, v)
        _check_kv("decode_attention", k, v, d)
        if index.dtype != torch.int64 or lens.dtype != torch.int32 or not index.is_contiguous() \
                or index.shape[0] != b or lens.shape != (b,):
            raise ValueError("decode_attention: index [B, L] int64 and lens [B] int32")
        out = torch.empty_like(q)
        lse = torch.empty(b, h, dtype=torch.float32)
        rc = self._fn["attn", q.dtype](_ptr(q), _ptr(k), _ptr(v), _ptr(index), _ptr(lens),
                                       b, h, kv, d, index.shape[1], scale, _ptr(out), _ptr(lse))
        if rc:
            raise ValueError(f"decode_attention: kernel refused its input (code {rc}): "
                             f"heads {h}, kv heads {kv}, head_dim {d}, or a length outside 1..L")
        return out, lse

    def chunk_attention_(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         index: torch.Tensor, pos: torch.Tensor, new: torch.Tensor,
                         context: torch.Tensor, scale: float, out: torch.Tensor,
                         lse: torch.Tensor) -> None:
        """Short runs of new tokens against their own keys, causally, read in place: entry
        ``e`` has ``new[e]`` queries at rows ``pos[e, :new[e]]`` of ``q`` ``[R, H, D]``; its
        ``i``-th reads its first ``context[e] + i + 1`` keys (slots ``index[e]``, ``[E, L]``).
        Writes those rows of ``out`` ``[R, H, D]`` and ``lse`` ``[R, H]`` (float32), as
        :func:`~structgen.backends.embedded.attention.attend_chunks` over gathered keys."""
        r, h, d = q.shape
        _check(q, k, v, out)
        _check_kv("chunk_attention_", k, v, d)
        e, n = pos.shape
        ints = ((index, torch.int64, 2), (pos, torch.int64, 2), (new, torch.int32, 1), (context, torch.int32, 1))
        if any(t.dtype != dt or t.dim() != nd or not t.is_contiguous() or t.shape[0] != e for t, dt, nd in ints) \
                or out.shape != q.shape or lse.shape != (r, h) or lse.dtype != torch.float32 or not lse.is_contiguous():
            raise ValueError("chunk_attention_: index/pos [E, *] int64, new/context [E] int32, out like q, lse [R, H]")
        rc = self._fn["chunk", q.dtype](_ptr(q), _ptr(k), _ptr(v), _ptr(index), _ptr(pos), _ptr(new),
                                        _ptr(context), e, n, r, h, k.shape[1], d, index.shape[1], scale,
                                        _ptr(out), _ptr(lse))
        if rc:
            raise ValueError(f"chunk_attention_: kernel refused its input (code {rc}): heads {h}, "
                             f"head_dim {d}, or a run outside its keys or rows")

    def shared_fits(self, q: torch.Tensor, k: torch.Tensor) -> bool:
        """Whether :meth:`shared_attention_` takes queries ``q`` against prefix keys ``k``:
        AMX here, bfloat16 heads of head_dim 64, at most ``MAX_SHARED`` keys."""
        return self.amx_attention and q.dtype == torch.bfloat16 and q.shape[-1] == 64 \
            and k.dim() == 3 and 1 <= k.shape[0] <= MAX_SHARED

    def shared_attention_(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                          out: torch.Tensor, lse: torch.Tensor, *, rows: torch.Tensor | None = None,
                          merge: bool = True) -> None:
        """Rows of ``q`` ``[R, H, 64]`` (``rows`` ``[B]`` int64, or None: all of them)
        against prefix keys they all share, ``k``/``v`` ``[P, KV, 64]``, on AMX tiles
        (:meth:`shared_fits`). With ``merge``, ``out`` ``[R, H, 64]`` and ``lse`` ``[R, H]``
        (float32) hold those rows' attention over their own keys, and the prefix's part is
        merged into them by log-sum-exp (as
        :func:`~structgen.backends.embedded.attention.merge_partials`); without, they are
        overwritten with the prefix's attention alone, as
        :func:`~structgen.backends.embedded.attention.attend_shared`. Other rows are left."""
        if not self.shared_fits(q, k):
            raise ValueError("shared_attention_: needs AMX-BF16 (amx_attention), bfloat16 heads of "
                             f"head_dim 64 and 1..{MAX_SHARED} keys")
        r, h, _ = q.shape
        _check(q, k, v, out)
        _check_kv("shared_attention_", k, v, 64)
        if out.shape != q.shape or lse.shape != (r, h) or lse.dtype != torch.float32 or not lse.is_contiguous() \
                or (rows is not None and (rows.dtype != torch.int64 or rows.dim() != 1 or not rows.is_contiguous())):
            raise ValueError("shared_attention_: out like q, lse [R, H] float32, rows [B] int64")
        b = r if rows is None else rows.shape[0]
        rc = self._shared(_ptr(q), _ptr(k), _ptr(v), None if rows is None else _ptr(rows), b, r, h,
                          k.shape[1], k.shape[0], scale, int(merge), _ptr(out), _ptr(lse))
        if rc:
            raise ValueError(f"shared_attention_: kernel refused its input (code {rc}): heads {h}, "
                             f"kv heads {k.shape[1]}, or a row outside 0..{r - 1}")

    def kv_write_(self, k_layer: torch.Tensor, v_layer: torch.Tensor, slots: torch.Tensor,
                  k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the new tokens' ``k``/``v`` ``[n, KV, D]`` (rows may be strided: views of
        the fused projection) at ``slots`` ``[n]`` (int64) of one pool layer, ``k_layer`` /
        ``v_layer`` ``[slots, KV, D]``, as ``index_copy_``; a slot outside the pool is a
        ValueError and nothing is written."""
        _check(k_layer, v_layer)
        n = slots.shape[0]
        for t in (k, v):
            if t.dtype != k_layer.dtype or t.device.type != "cpu" or t.shape != (n, *k_layer.shape[1:]) \
                    or t.stride(2) != 1 or t.stride(1) != t.shape[2]:
                raise ValueError("kv_write_: k and v [n, KV, D] in the pool's dtype, dense rows")
        if v_layer.shape != k_layer.shape or slots.dtype != torch.int64 or slots.dim() != 1 \
                or not slots.is_contiguous():
            raise ValueError("kv_write_: k_layer and v_layer alike, slots [n] int64")
        size = k.element_size()
        row = k_layer.shape[1] * k_layer.shape[2] * size
        rc = self._kv_write(_ptr(k_layer), _ptr(v_layer), _ptr(k), _ptr(v), _ptr(slots), n,
                            k.stride(0) * size, v.stride(0) * size, row, k_layer.shape[0])
        if rc:
            raise ValueError(f"kv_write_: a slot outside the pool's {k_layer.shape[0]}")

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float,
                 residual: torch.Tensor | None = None) -> torch.Tensor:
        """RMSNorm of ``x`` ``[T, N]``; with ``residual``, first ``x += residual`` in place
        (the decoder's residual add), then the norm of the sum."""
        _check(x, weight, *(() if residual is None else (residual,)))
        if x.dim() != 2 or weight.shape != x.shape[1:] or (residual is not None and residual.shape != x.shape):
            raise ValueError("rms_norm: x [T, N], weight [N], residual like x")
        y = torch.empty_like(x)
        self._fn["rms", x.dtype](_ptr(x), None if residual is None else _ptr(residual),
                                 _ptr(weight), _ptr(y), x.shape[0], x.shape[-1], eps)
        return y

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """``silu(gate) * up`` for ``gate_up`` ``[T, 2 I]`` = ``[gate | up]``: ``[T, I]``."""
        _check(gate_up)
        if gate_up.dim() != 2 or gate_up.shape[1] % 2:
            raise ValueError("silu_mul: gate_up [T, 2 I]")
        t, two_i = gate_up.shape
        out = torch.empty(t, two_i // 2, dtype=gate_up.dtype)
        self._fn["silu", gate_up.dtype](_ptr(gate_up), _ptr(out), t, two_i // 2)
        return out

    def rope_(self, x: torch.Tensor, heads: int, cos: torch.Tensor, sin_signed: torch.Tensor) -> None:
        """Rotate the first ``heads`` heads of ``x`` ``[T, H', D]`` (rows may be strided: a
        view of a larger row) in place: ``x * cos + rotate_half(x) * sin`` with
        rotate_half's sign folded into ``sin_signed``; ``cos``/``sin_signed`` ``[T, D]``."""
        t, _, d = x.shape
        if x.stride(2) != 1 or x.stride(1) != d or d > MAX_HEAD_DIM or d % 2:
            raise ValueError("rope_: heads of x must be dense rows of an even head_dim <= 256")
        _check(cos, sin_signed)
        if x.device.type != "cpu" or x.dtype != cos.dtype or cos.shape != (t, d) or sin_signed.shape != (t, d):
            raise ValueError("rope_: x on the CPU in cos's dtype; cos and sin_signed [T, D]")
        self._fn["rope", x.dtype](_ptr(x), x.stride(0), _ptr(cos), _ptr(sin_signed), t, heads, d)


def _check(*ts: torch.Tensor) -> None:
    first = ts[0]
    for t in ts:
        if t.device.type != "cpu" or t.dtype != first.dtype or t.dtype not in _SUFFIX \
                or not t.is_contiguous():
            raise ValueError("native kernels take contiguous CPU tensors of one dtype "
                             "(float32 or bfloat16)")


def _check_kv(kernel: str, k: torch.Tensor, v: torch.Tensor, head_dim: int) -> None:
    """One layer of the KV pool: k and v ``[slots, KV, head_dim]`` alike."""
    if k.dim() != 3 or k.shape != v.shape or k.shape[2] != head_dim:
        raise ValueError(f"{kernel}: k and v [slots, KV, D] with q's head_dim")


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _compiler() -> str | None:
    cc = os.environ.get("CC") or "cc"
    return shutil.which(cc)


def build(directory: Path | None = None) -> Path:
    """Compile ``cpu_kernels.c`` for this machine (or find it built); the library's path.
    Raises RuntimeError naming the reason where it cannot be built."""
    if platform.system() != "Linux":
        raise RuntimeError(f"native kernels are built on Linux only (this is {platform.system()})")
    cc = _compiler()
    if cc is None:
        raise RuntimeError("no C compiler (set $CC, or install gcc)")
    try:
        version = subprocess.run([cc, "--version"], capture_output=True, text=True,
                                 timeout=30, check=False).stdout.splitlines()[:1]
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeError(f"the C compiler {cc} does not run: {exc}") from exc
    src = SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([src, " ".join(FLAGS).encode(), cc.encode(),
                                     "".join(version).encode(), _cpu_flags().encode(),
                                     platform.machine().encode()])).hexdigest()[:16]
    directory = directory or cache_root() / "kernels"
    target = directory / f"cpu_kernels-{key}.so"
    if target.exists():
        return target
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".cpu_kernels-", suffix=".so")
    os.close(fd)
    try:
        proc = subprocess.run([cc, *FLAGS, str(SOURCE), "-o", tmp, "-lm"], capture_output=True,
                              text=True, timeout=300, check=False)
        if proc.returncode:
            raise RuntimeError(f"{cc} failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
        os.replace(tmp, target)  # atomic: a concurrent build of the same key wins or loses whole
    except (OSError, subprocess.SubprocessError) as exc:
        raise RuntimeError(f"building the native kernels failed: {exc}") from exc
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def _openmp_runtimes() -> list[str]:
    """The distinct OpenMP runtime files mapped into this process (Linux)."""
    try:
        maps = Path("/proc/self/maps").read_text()
    except OSError:
        return []
    return sorted({line.split()[-1] for line in maps.splitlines()
                   if ("libgomp" in line or "libiomp" in line) and "/" in line})


_lock = threading.Lock()
_loaded: list[Kernels | None] = []  # [] = not tried yet


def kernels() -> Kernels | None:
    """The kernels for this process (built and loaded once), or None where they cannot be
    (the reason logged once) or ``STRUCTGEN_NATIVE_KERNELS=0``."""
    if os.environ.get(ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    with _lock:
        if not _loaded:
            _loaded.append(_load())
        return _loaded[0]


def _load() -> Kernels | None:
    try:
        path = build()
        lib = ctypes.CDLL(str(path))
        if lib.sg_abi_version() != _ABI:
            raise RuntimeError(f"{path} has another ABI version")
        runtimes = _openmp_runtimes()
        if len(runtimes) > 1:  # torch's libgomp has another name here: a second thread team
            raise RuntimeError(f"two OpenMP runtimes would run side by side ({', '.join(runtimes)})")
        return Kernels(lib, path)
    except (RuntimeError, OSError, AttributeError) as exc:
        log.info("native CPU kernels unavailable, the torch code runs instead: %s", exc)
        return None
