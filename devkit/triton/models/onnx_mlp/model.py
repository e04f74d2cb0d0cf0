"""A real ONNX model (devkit.triton.onnx_models.build_mlp) run with onnxruntime on the CPU.

Triton Python-backend model: the requests of one dynamic batch are concatenated, run in one onnxruntime
call and split back. Parameters: `onnx_file` (default `<version>/model.onnx`), `intra_op_threads`
(default 1), `counter_file` (append "batch start end pid" per execution), `site_packages`.

This file runs inside Triton's Python backend stub, not in tailtune: it is excluded from mypy.
"""

import json
import os
import re
import sys
import time


def _use_site_packages():
    # The stub embeds its own Python; a server not started by devkit.triton.local may not lead it to the
    # venv, so take the `site_packages` parameter from the config on disk before numpy is imported.
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        with open(os.path.join(here, "config.pbtxt")) as f:
            text = f.read()
    except OSError:
        return
    m = re.search(r'key:\s*"site_packages"\s*value\s*\{\s*string_value:\s*"([^"]*)"', text)
    if m and m.group(1) not in sys.path:
        sys.path.append(m.group(1))


_use_site_packages()

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402


class TritonPythonModel:
    """ONNX MLP on onnxruntime."""

    def initialize(self, args):
        cfg = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in cfg.get("parameters", {}).items()}
        path = params.get("onnx_file") or os.path.join(
            args["model_repository"], args["model_version"], "model.onnx"
        )
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = int(params.get("intra_op_threads", "1"))
        opts.inter_op_num_threads = 1
        self.session = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
        self.input_name = cfg["input"][0]["name"]
        self.output_name = cfg["output"][0]["name"]
        self.counter_file = params.get("counter_file") or None

    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, self.input_name).as_numpy() for r in requests]
        sizes = [int(x.shape[0]) for x in xs]
        start = time.time()
        (y,) = self.session.run([self.output_name], {self.input_name: np.concatenate(xs).astype(np.float32)})
        end = time.time()
        if self.counter_file:
            fd = os.open(self.counter_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, f"{sum(sizes)} {start:.6f} {end:.6f} {os.getpid()}\n".encode())
            finally:
                os.close(fd)
        parts = np.split(y, np.cumsum(sizes)[:-1])
        return [pb_utils.InferenceResponse([pb_utils.Tensor(self.output_name, p)]) for p in parts]
