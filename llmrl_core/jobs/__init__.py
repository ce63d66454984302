"""Small end-to-end jobs built from the library, shared by the CLI and the Prefect flows."""
