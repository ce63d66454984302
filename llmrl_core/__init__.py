"""llmrl_core: the library half of llmrl (no Prefect, no MLflow).

Data structures, environments, policy backends, objectives and the train step live here;
orchestration lives in ``tasks/`` and ``flows/``, persistence and lineage in ``storage/``.
"""

__version__ = "0.1.0"
