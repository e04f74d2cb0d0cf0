"""Triton data plane: model config rendering, model control, a local tritonserver and CPU test models."""
