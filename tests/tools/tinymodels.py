"""Tiny random-weight Qwen2 / Llama / Mistral models with chat templates written here.

Each template renders ``tools`` the way its family's real template does (Qwen2.5's
Hermes block in the system turn, Llama 3.1's JSON instructions in the first user turn,
Mistral's ``[AVAILABLE_TOOLS]`` before the last user turn) and has its family's tool
role. The tokenizer is SmolLM2's; constraints hold whatever the weights, so only
structure is asserted.
"""

from __future__ import annotations

from pathlib import Path

QWEN = (
    "{%- if tools %}<|im_start|>system\n{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}"
    "\n</tool_call><|im_end|>\n"
    "{%- elif messages and messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'system' and loop.first %}"
    "{%- elif m.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "\n<tool_response>\n{{ m.content }}\n</tool_response>"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

LLAMA = (
    "{%- if messages and messages[0].role == 'system' %}{%- set sys = messages[0].content %}"
    "{%- set messages = messages[1:] %}{%- else %}{%- set sys = '' %}{%- endif %}"
    "<|start_header_id|>system<|end_header_id|>\n\n{{ sys }}<|eot_id|>"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' and loop.first and tools %}<|start_header_id|>user<|end_header_id|>\n\n"
    "Given the following functions, please respond with a JSON for a function call with its proper arguments "
    "that best answers the given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": "
    "dictionary of argument name and its value}. Do not use variables.\n\n"
    "{% for t in tools %}{{ t | tojson }}\n\n{% endfor %}{{ m.content }}<|eot_id|>"
    "{%- elif m.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>\n\n{{ m.content }}<|eot_id|>"
    "{%- else %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")

MISTRAL = (
    "{%- set ns = namespace(last_user=-1) %}"
    "{%- for m in messages %}{% if m.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' %}{% if tools and loop.index0 == ns.last_user %}[AVAILABLE_TOOLS]{{ tools | tojson }}"
    "[/AVAILABLE_TOOLS]{% endif %}[INST]{{ m.content }}[/INST]"
    "{%- elif m.role == 'system' %}[SYSTEM_PROMPT]{{ m.content }}[/SYSTEM_PROMPT]"
    "{%- elif m.role == 'tool' %}[TOOL_RESULTS]{\"content\": {{ m.content | tojson }}"
    "{%- if m.tool_call_id %}, \"call_id\": {{ m.tool_call_id | tojson }}{% endif %}}[/TOOL_RESULTS]"
    "{%- else %}{{ m.content }}</s>{%- endif %}"
    "{%- endfor %}")

SIZE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
        "num_key_value_heads": 2, "max_position_embeddings": 4096, "tie_word_embeddings": True}


def build(family: str, out: Path) -> Path:
    """A tiny random ``family`` model (qwen2, llama, mistral) with its template, at ``out``."""
    import torch
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    from structgen.backends.embedded.loader import load_tokenizer, save_model_dir

    if (out / "config.json").is_file():
        return out
    classes = {"qwen2": (Qwen2Config, Qwen2ForCausalLM, QWEN), "llama": (LlamaConfig, LlamaForCausalLM, LLAMA),
               "mistral": (MistralConfig, MistralForCausalLM, MISTRAL)}
    config_cls, model_cls, template = classes[family]
    tok = load_tokenizer()
    tok.chat_template = template
    torch.manual_seed(7)
    cfg = config_cls(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                     pad_token_id=tok.pad_token_id, head_dim=32, **SIZE)
    return save_model_dir(model_cls(cfg), tok, out)
