"""Small real MCP servers shipped with llmrl (for tests, demos and as examples to copy)."""
