"""Failure classes of an engine build: one exit code and one CamelCase reason each.

The build Job exits with the code and writes `<Reason>: <message>` to the termination log;
Kubernetes shows it on the pod and the operator copies it to the `EngineReady` condition.
"""

from __future__ import annotations

import enum

EXIT_OK = 0
REASON_OK = "EngineReady"


class Failure(enum.Enum):
    """A failure class: (exit code, reason, what it covers)."""

    INTERNAL_ERROR = (1, "InternalError", "a bug: an unexpected exception")
    INVALID_ARGUMENTS = (2, "InvalidArguments", "bad or inconsistent flags")
    FETCH_FAILED = (10, "FetchFailed", "URI unreachable, not found, denied, or its client library missing")
    DIGEST_MISMATCH = (11, "DigestMismatch", "the model's sha256 differs from --sha256")
    CORRUPT_MODEL = (12, "CorruptModel", "not a valid ONNX model (decode, checker or parser error)")
    UNSUPPORTED_OP = (13, "UnsupportedOp", "an op the backend cannot run")
    UNSUPPORTED_TENSOR = (14, "UnsupportedTensor", "an input/output dtype or dim that cannot be served")
    PRECISION_UNSUPPORTED = (15, "PrecisionUnsupported", "the precision is not supported on this GPU/backend")
    OUT_OF_MEMORY = (16, "OutOfMemory", "GPU or host memory ran out while building")
    GPU_MISMATCH = (17, "GpuMismatch", "no GPU visible, or not the product the engine is for")
    BUILD_FAILED = (18, "BuildFailed", "TensorRT missing, or it produced no engine for another reason")
    STORE_FAILED = (19, "StoreFailed", "the engine store could not be read or written")
    CHECKPOINT_MISMATCH = (20, "CheckpointMismatch", "the TensorRT-LLM checkpoint's dtype or ranks are not the spec's")

    @property
    def exit_code(self) -> int:
        return self.value[0]

    @property
    def reason(self) -> str:
        return self.value[1]

    @property
    def description(self) -> str:
        return self.value[2]


# exit code -> (reason, what it covers): the contract with the operator and with users.
EXIT_CODES: dict[int, tuple[str, str]] = {
    EXIT_OK: (REASON_OK, "built and stored, or found in the store"),
    **{f.exit_code: (f.reason, f.description) for f in Failure},
}


class BuildError(Exception):
    """A failure with its class and a short message that names what failed."""

    def __init__(self, failure: Failure, message: str, details: list[str] | None = None) -> None:
        super().__init__(message)
        self.failure = failure
        self.message = message
        # Further lines (every parser error, say): all go to stderr, the termination log takes what fits.
        self.details = details or []

    def __str__(self) -> str:
        return f"{self.failure.reason}: {self.message}"
