"""Writes small Python-backend model repositories for tests that need a real tritonserver.

`write_python_model(repo, name, model_py)` writes ``<repo>/<name>/config.pbtxt`` and
``<repo>/<name>/1/model.py``; `ADD_ONE_MODEL` is a working model (FP32 ``INPUT0`` → ``OUTPUT0``
= ``INPUT0 + 1``, plus ``PACKAGE`` = the imported tokenrouter_backend version, which proves
the server's PYTHONPATH/PATH let model.py files import the project and the venv's numpy).
"""
from __future__ import annotations

import re
import textwrap
from pathlib import Path

ONE_INPUT_ONE_OUTPUT_CONFIG = """\
name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [
  {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }},
  {{ name: "PACKAGE" data_type: TYPE_STRING dims: [ 1 ] }}
]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""

ADD_ONE_MODEL = """\
import numpy as np
import triton_python_backend_utils as pb_utils
import tokenrouter_backend


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            package = np.array([tokenrouter_backend.__version__.encode()], dtype=object)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", (x + 1).astype(np.float32)),
                pb_utils.Tensor("PACKAGE", package)]))
        return responses
"""

FAILING_MODEL = """\
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("{message}")

    def execute(self, requests):
        return []
"""


def write_python_model(repo: Path, name: str, model_py: str,
                       config: str = ONE_INPUT_ONE_OUTPUT_CONFIG) -> Path:
    """Write one Python-backend model into ``repo``; returns its directory."""
    model_dir = repo / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(config.format(name=name))
    (model_dir / "1" / "model.py").write_text(textwrap.dedent(model_py))
    return model_dir


def write_failing_model(repo: Path, name: str, message: str) -> Path:
    """A model whose ``initialize`` raises ``RuntimeError(message)``."""
    return write_python_model(repo, name, FAILING_MODEL.format(message=message))


def set_params(config: Path, **params) -> None:
    """Set config.pbtxt ``parameters`` values (each key must occur exactly once)."""
    text = config.read_text()
    for key, value in params.items():
        text, n = re.subn(rf'(key: "{key}",? value: {{ string_value: )"[^"]*"', rf'\1"{value}"', text)
        assert n == 1, (config, key)
    config.write_text(text)
