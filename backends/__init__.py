"""Backends shipped with structgen: one package per engine (``structgen.backends.<name>``).

Each is registered in the ``structgen.backends`` entry-point group and loaded lazily by
:func:`structgen.contract.registry.get_backend`, so importing structgen imports no engine.
"""
