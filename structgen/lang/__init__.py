"""The DSL: what a program is written in, and the sans-I/O core that runs it.

``api`` (gen, select, roles) builds frozen ``ir`` nodes; ``program`` decorates functions;
``state`` is the ``s`` a program appends to; ``interpreter`` turns nodes into backend
requests and results back into state, without I/O; ``run`` drives interpreters against a
backend; ``tracer`` finds a batch's shared prefix; ``choices`` scores ``select``.

Module paths follow SGLang's (``sglang.lang.ir``, ``sglang.lang.choices``), so programs that
import from them work with ``structgen.lang`` too (see :mod:`structgen.compat.sglang`).
"""
