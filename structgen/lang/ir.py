"""``sglang.lang.ir`` compatibility: the dtype regexes live here in SGLang."""

from structgen.constraints.spec import REGEX_BOOL, REGEX_FLOAT, REGEX_INT, REGEX_STR

__all__ = ["REGEX_BOOL", "REGEX_FLOAT", "REGEX_INT", "REGEX_STR"]
