"""structgen: structured LLM programs.

Write a program as a Python function over a state ``s``; append prompt text with
``s += ...``; generate with ``gen(...)`` under a regex, a JSON schema, a pydantic model,
``choices`` or ``dtype``; ``select`` by log-probabilities; use the tokenizer's own chat
template through ``system``/``user``/``assistant``; ``fork`` and ``join``; ``run``,
``run_batch`` and stream. SGLang frontend scripts run with ``import structgen as sgl``,
setup lines included (``sgl.set_default_backend(sgl.RuntimeEndpoint(url))``, ``sgl.OpenAI(...)``:
:mod:`structgen.compat.sglang`). Tool calling: ``gen(tools=...)``, :mod:`structgen.tools`.
``structgen.extract(...)`` (and the ``structgen extract`` command) is batch JSON extraction.

Importing structgen imports no torch, transformers or engine: backends load lazily.
"""

from structgen import extract
from structgen.compat.reasoning import separate_reasoning
from structgen.compat.sglang import (
    Anthropic,
    Engine,
    LiteLLM,
    OpenAI,
    Runtime,
    RuntimeEndpoint,
    VertexAI,
    flush_cache,
    get_server_args,
    get_server_info,
)
from structgen.constraints.spec import REGEX_BOOL, REGEX_FLOAT, REGEX_INT, REGEX_STR
from structgen.contract.backend import Backend, Capabilities, SamplingParams
from structgen.contract.registry import (
    available_backends,
    get_backend,
    get_default_backend,
    set_default_backend,
)
from structgen.errors import (
    BackendError,
    BatchInterrupted,
    CapabilityError,
    ConstraintError,
    DeadlineExceededError,
    InputError,
    OptionError,
    OutputValidationError,
    ProgramError,
    RequestCancelled,
    ResponseTooLargeError,
    StructgenError,
)
from structgen.lang.api import (
    assistant,
    assistant_begin,
    assistant_end,
    gen,
    gen_int,
    gen_string,
    image,
    select,
    system,
    system_begin,
    system_end,
    tool_message,
    tool_results,
    use_tools,
    user,
    user_begin,
    user_end,
    video,
)
from structgen.lang.choices import (
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)
from structgen.lang.program import Program, RunOptions, function, program
from structgen.lang.state import ForkGroup, ProgramState
from structgen.tools import Agent, Tool, ToolCall, ToolResult, ToolTurn, run_tools, tool

__version__ = "0.1.0"

__all__ = [
    "REGEX_BOOL",
    "REGEX_FLOAT",
    "REGEX_INT",
    "REGEX_STR",
    "Agent",
    "Anthropic",
    "Backend",
    "BackendError",
    "BatchInterrupted",
    "Capabilities",
    "CapabilityError",
    "ConstraintError",
    "DeadlineExceededError",
    "Engine",
    "ForkGroup",
    "InputError",
    "LiteLLM",
    "OpenAI",
    "OptionError",
    "OutputValidationError",
    "Program",
    "ProgramError",
    "ProgramState",
    "RequestCancelled",
    "ResponseTooLargeError",
    "RunOptions",
    "Runtime",
    "RuntimeEndpoint",
    "SamplingParams",
    "StructgenError",
    "Tool",
    "ToolCall",
    "ToolResult",
    "ToolTurn",
    "VertexAI",
    "assistant",
    "assistant_begin",
    "assistant_end",
    "available_backends",
    "extract",
    "flush_cache",
    "function",
    "gen",
    "gen_int",
    "gen_string",
    "get_backend",
    "get_default_backend",
    "get_server_args",
    "get_server_info",
    "greedy_token_selection",
    "image",
    "program",
    "run_tools",
    "select",
    "separate_reasoning",
    "set_default_backend",
    "system",
    "system_begin",
    "system_end",
    "token_length_normalized",
    "tool",
    "tool_message",
    "tool_results",
    "unconditional_likelihood_normalized",
    "use_tools",
    "user",
    "user_begin",
    "user_end",
    "video",
]
