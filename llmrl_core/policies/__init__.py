"""Policy backends: a resident vLLM engine for sampling and transformers for teacher-forced scoring."""
