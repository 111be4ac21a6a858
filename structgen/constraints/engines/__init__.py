"""The constraint engines, peers under one contract (:class:`~structgen.constraints.base.Engine`).

* :mod:`.llguidance` -- every spec kind; JSON schemas with llguidance's JSON options;
* :mod:`.xgrammar` -- JSON schemas (optional; XGrammar is imported on first use).

Neither imports the other; :mod:`structgen.constraints.ladder` composes them.
"""
