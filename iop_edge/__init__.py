"""iop-edge: one OpenAI-compatible endpoint in front of a pool of LLM providers."""

__version__ = "0.1.0"
