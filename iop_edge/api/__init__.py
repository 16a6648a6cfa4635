"""The OpenAI-compatible HTTP surface: auth, request handling, catalog, error envelope."""
