"""Triton Python-backend model `heavy`: all logic is in tokenrouter_backend.triton_branch."""
from tokenrouter_backend.triton_branch import TritonPythonModel  # noqa: F401
