"""Preprocessing model: text -> token ids (see tokenrouter_backend.serving.text_models)."""
import triton_python_backend_utils as pb_utils

from tokenrouter_backend.serving.text_models import PreprocessingModel


class TritonPythonModel:
    def initialize(self, args):
        self.model = PreprocessingModel(pb_utils, args)

    def execute(self, requests):
        return self.model.execute(requests)
