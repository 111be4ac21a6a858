"""SGLang frontend compatibility: what lets ``import structgen as sgl`` run SGLang scripts.

The DSL itself (``function``, ``gen``, ``select``, roles, ``fork``, ``run_batch``) has
SGLang's names and signatures and lives in :mod:`structgen.lang`, whose module paths
mirror SGLang's: ``sglang.lang.ir`` (the dtype regexes) is :mod:`structgen.lang.ir`,
``sglang.lang.choices`` (select scoring methods) is :mod:`structgen.lang.choices`.
"""
