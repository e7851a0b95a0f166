"""Postprocessing model: token ids -> text, incrementally (see tokenrouter_backend.triton_text)."""
import triton_python_backend_utils as pb_utils

from tokenrouter_backend.triton_text import PostprocessingModel


class TritonPythonModel:
    def initialize(self, args):
        self.model = PostprocessingModel(pb_utils, args)

    def execute(self, requests):
        return self.model.execute(requests)
