"""TokenRouter: token-level routing between a light and a heavy LLM served by Triton."""
__version__ = "0.1.0"
