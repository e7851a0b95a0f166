"""Triton Python-backend model `light`: all logic is in tokenrouter_backend.serving.branch_model."""
from tokenrouter_backend.serving.branch_model import TritonPythonModel  # noqa: F401
