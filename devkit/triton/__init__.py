"""The Triton test harness: a local `tritonserver` (from the nvidia-pytriton wheel, CPU), perf_analyzer, model
repositories of the two CPU Python-backend test models in `models/`, and the ONNX test model."""
