"""Which model families the owned forward runs, read off a transformers model.

The embedded engine's forward (:mod:`structgen.backends.embedded.model`) is one pre-norm
decoder: RMSNorm, rotary attention with grouped KV heads, a SiLU-gated MLP. The families
users bring differ from it by a few switches, found here once per model:

* Llama 2 / 3 (``llama``): Llama 3's rope scaling (``llama3``; also ``linear``, ``yarn``),
  optional ``attention_bias`` / ``mlp_bias``;
* Qwen2 / 2.5 (``qwen2``): biases on q/k/v, often tied embeddings;
* Qwen3 (``qwen3``): RMSNorm of each query and key head before rotation;
* Mistral (``mistral``): a sliding attention window.

Anything else raises :class:`~structgen.errors.BackendError` naming what is missing (the
``model_type``, or the config field and value the forward cannot honour).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from structgen.errors import BackendError

__all__ = ["FAMILIES", "ModelSpec", "model_spec"]

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
#: rope types whose frequencies do not depend on the sequence length
_STATIC_ROPE = ("default", "linear", "llama3", "yarn")
_LAYER_PARTS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm",
                "post_attention_layernorm")


@dataclass(frozen=True)
class ModelSpec:
    """What the forward needs to know beyond the weights.

    ``windows[i]``: layer ``i``'s sliding attention window (a query at position ``p``
    sees keys ``p - window + 1 .. p``), or None for full attention. ``context_length``:
    positions a sequence may use (``max_position_embeddings``).
    """

    family: str
    context_length: int
    windows: tuple[int | None, ...]
    qk_norm: bool


def _fail(what: str) -> BackendError:
    return BackendError(f"the embedded engine cannot run this model: {what}; it runs the "
                        f"{', '.join(FAMILIES)} families", backend="embedded")


def _rope_type(cfg: Any) -> str:
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if isinstance(rope, dict) and rope and all(isinstance(v, dict) for v in rope.values()):
        raise _fail("per-layer rope parameters (config field rope_parameters)")
    kind = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    return str(kind or "default")


def _windows(cfg: Any, family: str, n_layers: int) -> tuple[int | None, ...]:
    window = getattr(cfg, "sliding_window", None)
    if family == "mistral":
        if getattr(cfg, "layer_types", None) and any(t != "full_attention" for t in cfg.layer_types):
            raise _fail(f"config field layer_types={list(cfg.layer_types)!r}")
        return (window,) * n_layers if window else (None,) * n_layers
    types = getattr(cfg, "layer_types", None)
    if family in ("qwen2", "qwen3") and types:
        if len(types) != n_layers or any(t not in ("full_attention", "sliding_attention") for t in types):
            raise _fail(f"config field layer_types={list(types)!r}")
        if any(t == "sliding_attention" for t in types) and not window:
            raise _fail("sliding_attention layers without config field sliding_window")
        return tuple(window if t == "sliding_attention" else None for t in types)
    return (None,) * n_layers


def model_spec(hf_model: Any) -> ModelSpec:
    """Check that the forward can run ``hf_model`` (a transformers causal LM); its spec."""
    cfg = getattr(hf_model, "config", None)
    family = getattr(cfg, "model_type", None)
    if cfg is None or family not in FAMILIES:
        raise _fail(f"model_type {family!r}")
    act = getattr(cfg, "hidden_act", "silu")
    if act != "silu":
        raise _fail(f"config field hidden_act={act!r} (the MLP is SiLU-gated)")
    kind = _rope_type(cfg)
    if kind not in _STATIC_ROPE:
        raise _fail(f"config field rope_parameters.rope_type={kind!r} (runs {', '.join(_STATIC_ROPE)})")
    partial = getattr(cfg, "partial_rotary_factor", None)
    if partial not in (None, 1, 1.0):
        raise _fail(f"config field partial_rotary_factor={partial!r}")
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        raise _fail(f"num_attention_heads={cfg.num_attention_heads} not a multiple of "
                    f"num_key_value_heads={cfg.num_key_value_heads}")
    inner = getattr(hf_model, "model", None)
    layers = list(getattr(inner, "layers", None) or [])
    if not layers or not hasattr(inner, "embed_tokens") or not hasattr(inner, "norm") \
            or not hasattr(hf_model, "lm_head") or not hasattr(inner, "rotary_emb"):
        raise _fail(f"a {type(hf_model).__name__} without the decoder layout "
                    "(model.embed_tokens, model.layers, model.norm, lm_head)")
    for part in _LAYER_PARTS:
        obj = layers[0]
        for name in part.split("."):
            obj = getattr(obj, name, None)
        if obj is None:
            raise _fail(f"decoder layers without {part}")
    attn = layers[0].self_attn
    qk_norm = hasattr(attn, "q_norm") and hasattr(attn, "k_norm")
    if family == "qwen3" and not qk_norm:
        raise _fail("a qwen3 model without q_norm / k_norm")
    context = int(getattr(cfg, "max_position_embeddings", 0) or 0) or 1 << 30
    return ModelSpec(family, context, _windows(cfg, family, len(layers)), qk_norm)
