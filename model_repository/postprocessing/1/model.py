"""Postprocessing model: token ids -> text, incrementally (see tokenrouter_backend.serving.text_models)."""
import triton_python_backend_utils as pb_utils

from tokenrouter_backend.serving.text_models import PostprocessingModel


class TritonPythonModel:
    def initialize(self, args):
        self.model = PostprocessingModel(pb_utils, args)

    def execute(self, requests):
        return self.model.execute(requests)
