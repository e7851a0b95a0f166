"""Exporter: HF folder / GGUF causal LM pair -> ONNX branches (heavy FP32/FP16, light INT8),
tokenizer copy and a filled Triton model repository; plus the tiny test pair.

Modules: ``tiny_pair`` (test pair), ``sources`` (loading HF/GGUF), ``onnx_export`` (flat-KV
ONNX), ``quantize`` (light INT8), ``validate`` (ONNX vs transformers), ``repository``
(template filling), ``pipeline`` (``tokenrouter export``) with ``options``, ``branch_export``,
``branch_stamp``, ``light_pick`` and ``repository_values``; docs/architecture.md lists the rest.
"""
