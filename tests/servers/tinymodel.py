"""A tiny random-weight Llama, built at test time, saved with the embedded model's tokenizer.

Constraints must hold whatever the weights, so a random model is enough for servers.
Head size 32 (vLLM's CPU attention needs >= 32). Built once into a cache directory.
"""

from __future__ import annotations

from pathlib import Path

CONFIG = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
          "num_key_value_heads": 2, "head_dim": 32, "max_position_embeddings": 4096,
          "tie_word_embeddings": True, "rms_norm_eps": 1e-5}
SEED = 1234


def cache_dir() -> Path:
    from structgen.backends.embedded.model_cache import cache_root

    return cache_root() / "test-models" / "tiny-llama-h64-l2-v1"


def build_tiny_llama(out: Path | None = None) -> Path:
    """Return a directory with config, random weights and tokenizer (built if missing)."""
    out = out or cache_dir()
    if (out / "config.json").is_file() and (out / "tokenizer_config.json").is_file():
        return out
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from structgen.backends.embedded.loader import load_tokenizer, save_model_dir

    tok = load_tokenizer()
    torch.manual_seed(SEED)
    cfg = LlamaConfig(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, **CONFIG)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    return save_model_dir(model, tok, out)

if __name__ == "__main__":
    print(build_tiny_llama())
