"""The DSL: what a program is written in, and the sans-I/O core that runs it.

``api`` (gen, select, roles) builds frozen ``ir`` nodes, its options checked by ``options``;
``program`` decorates functions; ``state`` is the ``s`` a program appends to;
``interpreter`` turns nodes into backend requests and results back into state, without
I/O, dispatching through the request-kind table in ``kinds`` (generate, select); ``run``
owns one run's lifecycle and its drive loop; ``batch`` runs many (with ``progress``);
``stream`` holds a streaming run's text; ``tracer`` finds a batch's shared prefix;
``choices`` scores ``select``.

Module paths follow SGLang's (``sglang.lang.ir``, ``sglang.lang.choices``), so programs that
import from them work with ``structgen.lang`` too (see :mod:`structgen.compat.sglang`).
"""
