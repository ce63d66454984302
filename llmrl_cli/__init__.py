"""The ``llmrl`` command line: model preparation, environment checks and the main jobs."""
