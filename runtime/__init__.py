"""The runtime under the Prefect tasks: the Dask actors (rollout worker, trainer worker, SFT trainer), their
placement on a local or joined cluster, the routes new weights take to the engines, the rows they read and write,
and the run's console and worker logs. It imports ``llmrl_core`` and ``storage``, never ``tasks`` or ``flows``."""
