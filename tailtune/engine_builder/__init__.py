"""The engine build Job: fetch an ONNX model, check it, build a TensorRT engine (or lay out the
ONNX file for onnxruntime) and publish it to the engine store under its cache key.

Runs inside the build Job's image; imports neither kopf, kubernetes nor the operator.
Entry point: `python -m tailtune.engine_builder build ...` (see `cli`).
"""
