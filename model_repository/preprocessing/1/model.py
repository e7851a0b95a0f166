"""Preprocessing model: text -> token ids (see tokenrouter_backend.triton_text)."""
import triton_python_backend_utils as pb_utils

from tokenrouter_backend.triton_text import PreprocessingModel


class TritonPythonModel:
    def initialize(self, args):
        self.model = PreprocessingModel(pb_utils, args)

    def execute(self, requests):
        return self.model.execute(requests)
