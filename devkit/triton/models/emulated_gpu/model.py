"""EMULATED ACCELERATOR (not a real GPU): a Triton Python-backend model that behaves like one device.

Each execution of a batch of b items takes t(b) = base_ms + per_item_ms * b ** exponent milliseconds
(parameters; default 2 ms + 0.4 ms * b^1.3) during which the CPU stays idle (sleep). All instances of the
model share ONE emulated device: an exclusive `fcntl.flock` on the file named by the `device_lock`
parameter (instances are separate processes) serializes executions the way kernels serialize on one GPU,
so throughput does not grow with the instance count. The kernel hands the lock to one waiter in no promised
order (not FIFO, unlike the simulator's device): measured at 4 instances and 85 % load, 2 % of requests finished
before one sent earlier, by at most about one execution; P99 stayed within the measurement's noise of the
simulator's on the same arrivals (bench/tuner/instances.py). The output is real (OUTPUT = INPUT * 2) and every
execution is appended to the `counter_file` parameter's file, if set, as "batch start end pid". A
`fail_batch_size` parameter injects a device fault: executions of exactly that many items raise; an `extra_ms`
parameter (the harness's slow-reload fault, `devkit.faults`) adds that much to every execution.

This file runs inside Triton's Python backend stub, not in tailtune: it is excluded from mypy.
"""

import fcntl
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

import triton_python_backend_utils as pb_utils  # noqa: E402


def service_seconds(batch, base_ms, per_item_ms, exponent):
    """The emulated device's time for one execution of `batch` items."""
    return (base_ms + per_item_ms * batch**exponent) / 1e3


class TritonPythonModel:
    """Emulated accelerator: shared device, service time t(b), output = input * 2."""

    def initialize(self, args):
        cfg = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in cfg.get("parameters", {}).items()}
        self.base_ms = float(params.get("base_ms", "2.0"))
        self.per_item_ms = float(params.get("per_item_ms", "0.4"))
        self.exponent = float(params.get("exponent", "1.3"))
        lock = params.get("device_lock") or os.path.join(args["model_repository"], "device.lock")
        self.lock_fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        self.counter_file = params.get("counter_file") or None
        self.fail_batch_size = int(params.get("fail_batch_size", "0"))
        self.extra_s = float(params.get("extra_ms", "0")) / 1e3
        self.input_name = cfg["input"][0]["name"]
        self.output_name = cfg["output"][0]["name"]
        self.output_dtype = pb_utils.triton_string_to_numpy(cfg["output"][0]["data_type"])

    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, self.input_name).as_numpy() for r in requests]
        batch = sum(int(x.shape[0]) for x in xs)
        fcntl.flock(self.lock_fd, fcntl.LOCK_EX)  # wait for the one device
        try:
            start = time.time()
            time.sleep(service_seconds(batch, self.base_ms, self.per_item_ms, self.exponent) + self.extra_s)
            end = time.time()
        finally:
            fcntl.flock(self.lock_fd, fcntl.LOCK_UN)
        if self.counter_file:
            line = f"{batch} {start:.6f} {end:.6f} {os.getpid()}\n".encode()
            fd = os.open(self.counter_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)  # one small O_APPEND write: lines of concurrent instances never mix
            finally:
                os.close(fd)
        if batch == self.fail_batch_size:
            # Raise, never return error responses: an error response to a warmup sample crashes tritonserver
            # 2.51 (SIGSEGV in the python backend), while an exception fails the load cleanly.
            raise pb_utils.TritonModelException(f"emulated device fault at batch size {batch}")
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor(self.output_name, (x * 2).astype(self.output_dtype))])
            for x in xs
        ]

    def finalize(self):
        os.close(self.lock_fd)
