"""Engines: the KV store, the batched branch engine, the ONNX and torch runtimes. Imports core/
only.
"""
