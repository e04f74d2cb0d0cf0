"""pydantic models of `InferenceService` (tailtune.io/v1alpha1).

These models are the only schema: `tailtune.api.crdgen` turns them into the CRD, and the operator parses
every object it reads through them. Field names are camelCase on the wire (aliases), snake_case in Python.
Cross-field rules live twice on purpose: as CEL (`x-kubernetes-validations`, enforced at admission) and as
pydantic validators (so the operator judges objects the same way when it reads them).
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

GROUP = "tailtune.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferenceService"
PLURAL = "inferenceservices"
SINGULAR = "inferenceservice"
SHORT_NAMES = ("tis",)
CATEGORIES = ("tailtune",)

# CEL at the schema's root, the one place that may read metadata.name: the name becomes the Service's name and
# the `app.kubernetes.io/instance` label of every child, so it must be a DNS-1035 label (the operator checks
# the same in `operator.spec_checks`, for objects admitted before this rule).
ROOT_CEL: tuple[tuple[str, str, str | None], ...] = (
    (
        "self.metadata.name.size() <= 63 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
        "metadata.name must be a DNS-1035 label: at most 63 characters, lower-case letters, digits and '-', "
        "starting with a letter (it names the Service and the app.kubernetes.io/instance label)",
        None,
    ),
)

# The spec's bounds that tools outside admission (`tailtune simulate`, `tailtune plan`) apply too.
MAX_BATCH_SIZE = 4096  # Triton max_batch_size, the engine profile's max, every batch size in the spec
MAX_REPLICAS = 1000
MAX_INSTANCES_PER_GPU = 16

DEFAULT_TRITON_IMAGE = "nvcr.io/nvidia/tritonserver:25.01-py3"
DEFAULT_BUILDER_IMAGE = "ghcr.io/tailtune/engine-builder:0.1.0-trt25.01"

Precision = Literal["fp32", "fp16", "bf16", "int8", "fp8"]
DataType = Literal[
    "TYPE_BOOL",
    "TYPE_UINT8",
    "TYPE_UINT16",
    "TYPE_UINT32",
    "TYPE_UINT64",
    "TYPE_INT8",
    "TYPE_INT16",
    "TYPE_INT32",
    "TYPE_INT64",
    "TYPE_FP16",
    "TYPE_FP32",
    "TYPE_FP64",
    "TYPE_BF16",
    "TYPE_STRING",
]


class Model(BaseModel):
    """Base for every API object: camelCase on the wire, unknown fields refused."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)
    # CEL rules attached to this object's schema by crdgen: (rule, message, fieldPath or None).
    cel: ClassVar[tuple[tuple[str, str, str | None], ...]] = ()


class TensorSpec(Model):
    """One input or output tensor of the model, without the batch dimension."""

    name: Annotated[str, Field(min_length=1, max_length=256, description="Tensor name as in the ONNX graph.")]
    data_type: Annotated[DataType, Field(description="Triton data type, e.g. TYPE_FP32.")]
    dims: Annotated[
        list[Annotated[int, Field(ge=-1)]],
        Field(min_length=1, max_length=8, description="Shape without the batch dimension; -1 for dynamic."),
    ]


ModelKind = Literal["request", "generative"]


class ModelSource(Model):
    """Where the ONNX model comes from."""

    uri: Annotated[
        str,
        Field(
            pattern=r"^(s3|gs|https|http|pvc)://[^\s]+$",
            max_length=2048,
            description="Model location: s3://bucket/key, gs://bucket/key, https://host/path or "
            "pvc://claim/path/model.onnx.",
        ),
    ]
    format: Annotated[Literal["onnx"], Field(description="Model format. Only onnx is supported.")] = "onnx"
    kind: Annotated[
        ModelKind,
        Field(
            description="request: one response per request, judged by slo.latencyMs; generative: an LLM that "
            "streams tokens (decoupled, inflight batching), judged by slo.ttft (time to the first token) and "
            "slo.tpot (time per output token), which it needs."
        ),
    ] = "request"
    sha256: Annotated[
        str | None,
        Field(
            pattern=r"^[a-f0-9]{64}$",
            description="Pins the model file's bytes by their sha256 (lower-case hex), as a digest pins an image: "
            "the build fails with DigestMismatch when spec.model.uri serves other bytes, and a new value builds "
            "a new engine (it keys the engine cache). Without it the engine is built once from whatever bytes the "
            "URI served (status.engine.modelDigest) and the URI is not read again.",
        ),
    ] = None
    revision: Annotated[
        str | None,
        Field(
            min_length=1,
            max_length=128,
            pattern=r"^\S+$",
            description="Any label of the model's version (a date, a tag). It keys the engine cache, so a new value "
            "builds the engine again from the bytes spec.model.uri serves now: set it after replacing the file "
            "at the same URI.",
        ),
    ] = None
    name: Annotated[
        str | None,
        Field(
            pattern=r"^[a-zA-Z0-9_][a-zA-Z0-9_.-]{0,62}$",
            description="Model name inside Triton. Defaults to the InferenceService's name.",
        ),
    ] = None
    inputs: Annotated[
        list[TensorSpec] | None,
        Field(max_length=64, description="Input overrides, when the ONNX graph leaves shapes unknown."),
    ] = None
    outputs: Annotated[list[TensorSpec] | None, Field(max_length=64, description="Output overrides.")] = None


class OptimizationProfile(Model):
    """TensorRT optimization profile over the batch dimension."""

    cel = (("self.opt <= self.max", "optimizationProfile.opt must be <= optimizationProfile.max", None),)

    opt: Annotated[int, Field(ge=1, le=MAX_BATCH_SIZE, description="Batch size TensorRT tunes kernels for.")] = 8
    max: Annotated[
        int, Field(ge=1, le=MAX_BATCH_SIZE, description="Largest batch the engine accepts (Triton's upper bound).")
    ] = 32

    @model_validator(mode="after")
    def _opt_le_max(self) -> OptimizationProfile:
        if self.opt > self.max:
            raise ValueError("optimizationProfile.opt must be <= optimizationProfile.max")
        return self


class EngineStore(Model):
    """Where built engines are kept, so each is built once per model, TensorRT version and GPU product."""

    pvc: Annotated[
        str,
        Field(
            pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
            max_length=253,
            description="PersistentVolumeClaim holding the engine cache (ReadWriteMany for several nodes).",
        ),
    ] = "tailtune-engines"


BLANK_BUILDER_IMAGE = (
    "engine.builderImage must be an image reference without blanks (e.g. registry/engine-builder:tag); "
    "leave it out to use the default"
)


# TensorRT-LLM's own bounds as trtllm-build takes them (int32 token counts); the spec allows up to 1 Mi tokens.
MAX_LLM_TOKENS = 1_048_576
LlmDtype = Literal["float16", "bfloat16", "float32"]
LLM_SEQ_NOT_ABOVE_INPUT = (
    "engine.llm.maxSeqLen must be > engine.llm.maxInputLen (a sequence is the prompt plus at least one output "
    "token): raise maxSeqLen or lower maxInputLen"
)
LLM_TENSOR_PARALLEL_ONE = (
    "engine.llm.tensorParallel must be 1: Triton's tensorrtllm backend runs a tensor-parallel engine as one MPI "
    "rank per GPU (launch_triton_server.py --world_size), which the serving pod (one tritonserver) does not launch"
)


class LlmEngine(Model):
    """A generative model's TensorRT-LLM engine: trtllm-build's limits, fixed at build (a change builds anew)."""

    cel = (
        (
            "!has(self.maxSeqLen) || self.maxSeqLen > self.maxInputLen",
            LLM_SEQ_NOT_ABOVE_INPUT,
            ".maxSeqLen",
        ),
    )

    max_batch_size: Annotated[
        int,
        Field(
            ge=1,
            le=MAX_BATCH_SIZE,
            description="trtllm-build --max_batch_size: the most sequences the engine schedules at once (default "
            "2048, trtllm-build's).",
        ),
    ] = 2048
    max_num_tokens: Annotated[
        int,
        Field(
            ge=1,
            le=MAX_LLM_TOKENS,
            description="trtllm-build --max_num_tokens: the most tokens one iteration batches, prompts and decode "
            "steps together (default 8192, trtllm-build's). Without chunked context it must hold a whole prompt "
            "(>= maxInputLen).",
        ),
    ] = 8192
    max_input_len: Annotated[
        int,
        Field(
            ge=1,
            le=MAX_LLM_TOKENS,
            description="trtllm-build --max_input_len: the longest prompt, tokens (default 1024, trtllm-build's).",
        ),
    ] = 1024
    max_seq_len: Annotated[
        int | None,
        Field(
            ge=2,
            le=MAX_LLM_TOKENS,
            description="trtllm-build --max_seq_len: the longest prompt plus output, tokens. Unset: trtllm-build "
            "takes the checkpoint's max_position_embeddings.",
        ),
    ] = None
    dtype: Annotated[
        LlmDtype | None,
        Field(
            description="The checkpoint's dtype the build expects (config.json dtype); the build fails with "
            "CheckpointDtypeMismatch when the checkpoint has another (trtllm-build builds in the checkpoint's "
            "dtype, set by convert_checkpoint.py). Unset: whatever the checkpoint has.",
        ),
    ] = None
    tensor_parallel: Annotated[
        Literal[1],
        Field(
            description="Tensor parallelism; only 1: Triton's tensorrtllm backend runs a tensor-parallel engine as "
            "one MPI rank per GPU (launch_triton_server.py --world_size), which the serving pod does not launch.",
        ),
    ] = 1

    @model_validator(mode="after")
    def _seq_above_input(self) -> LlmEngine:
        if self.max_seq_len is not None and self.max_seq_len <= self.max_input_len:
            raise ValueError(LLM_SEQ_NOT_ABOVE_INPUT)
        return self

    @property
    def needs_chunked_context(self) -> bool:
        """A prompt of maxInputLen fits one iteration only in chunks (serving.llm.enableChunkedContext must stay on)."""
        return self.max_num_tokens < self.max_input_len


class Engine(Model):
    """How the serving engine is built."""

    cel = (
        (
            "self.precision != 'int8' || has(self.calibrationCacheUri)",
            "precision int8 needs engine.calibrationCacheUri",
            ".calibrationCacheUri",
        ),
        (
            "self.backend != 'onnxruntime' || self.precision == 'fp32'",
            "backend onnxruntime serves the ONNX model as it is: set engine.precision to fp32",
            ".precision",
        ),
        (
            "!has(self.builderImage) || self.builderImage.matches('^\\\\S+$')",
            BLANK_BUILDER_IMAGE,
            ".builderImage",
        ),
    )

    backend: Annotated[
        Literal["tensorrt", "onnxruntime"],
        Field(description="tensorrt builds a plan in a Job on the serving GPU; onnxruntime serves the ONNX."),
    ] = "tensorrt"
    precision: Annotated[Precision, Field(description="Build precision.")] = "fp16"
    optimization_profile: Annotated[OptimizationProfile, Field(description="Batch-dimension optimization profile.")] = (
        OptimizationProfile()
    )
    workspace_mi_b: Annotated[
        int, Field(alias="workspaceMiB", ge=64, le=262144, description="TensorRT workspace limit in MiB.")
    ] = 4096
    builder_optimization_level: Annotated[
        int, Field(ge=0, le=5, description="TensorRT builder optimization level.")
    ] = 3
    timing_cache: Annotated[bool, Field(description="Load and save a timing cache beside the engines.")] = True
    calibration_cache_uri: Annotated[
        str | None,
        Field(pattern=r"^(s3|gs|https|http|pvc)://[^\s]+$", description="INT8 calibration cache location."),
    ] = None
    builder_image: Annotated[
        str, Field(min_length=1, description="Image of the engine-build Job (TensorRT + tailtune[builder]).")
    ] = DEFAULT_BUILDER_IMAGE
    store: Annotated[EngineStore, Field(description="Engine cache storage.")] = EngineStore()
    deadline_seconds: Annotated[int, Field(ge=60, le=86400, description="activeDeadlineSeconds of the build Job.")] = (
        3600
    )
    backoff_limit: Annotated[int, Field(ge=0, le=10, description="backoffLimit of the build Job.")] = 1
    pod_annotations: Annotated[dict[str, str], Field(description="Annotations added to the build Job's pod.")] = Field(
        default_factory=dict
    )
    llm: Annotated[
        LlmEngine | None,
        Field(
            description="Generative models (spec.model.kind generative) only: the TensorRT-LLM engine's limits, "
            "built by trtllm-build from the TensorRT-LLM checkpoint at spec.model.uri. Unset on a generative "
            "model: trtllm-build's defaults.",
        ),
    ] = None

    @model_validator(mode="after")
    def _rules(self) -> Engine:
        if self.precision == "int8" and self.calibration_cache_uri is None:
            raise ValueError("precision int8 needs engine.calibrationCacheUri")
        if self.backend == "onnxruntime" and self.precision != "fp32":
            raise ValueError("backend onnxruntime serves the ONNX model as it is: set engine.precision to fp32")
        if not re.fullmatch(r"\S+", self.builder_image):
            raise ValueError(BLANK_BUILDER_IMAGE)
        return self


class Gpu(Model):
    """The GPU each serving pod gets, matched to the `nvidia.com/gpu.product` node label."""

    product: Annotated[
        str,
        Field(
            min_length=1,
            max_length=63,
            pattern=r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
            description="GPU product as labelled by GPU feature discovery, e.g. NVIDIA-L4.",
        ),
    ]
    count: Annotated[int, Field(ge=1, le=16, description="GPUs per serving pod.")] = 1


class Replicas(Model):
    """Replica bounds; the tuner moves between them when batching alone cannot hold the SLO."""

    cel = (("self.min <= self.max", "replicas.min must be <= replicas.max", None),)

    min: Annotated[int, Field(ge=0, le=MAX_REPLICAS, description="Fewest serving pods.")] = 1
    max: Annotated[int, Field(ge=1, le=MAX_REPLICAS, description="Most serving pods.")] = 1
    scale_in_stabilization_seconds: Annotated[
        int | None,
        Field(
            ge=0,
            le=3600,
            description="Scale in only as far as the highest demand of this many seconds allows (like the "
            "HorizontalPodAutoscaler's scale-down stabilization window). Unset: only as far as the demand's upper "
            "bound over the time a replica given back takes to return (an interval plus the measured pod start) "
            "allows, its rises over the last 300 s (the HPA's window) as margin.",
        ),
    ] = None

    @model_validator(mode="after")
    def _min_le_max(self) -> Replicas:
        if self.min > self.max:
            raise ValueError("replicas.min must be <= replicas.max")
        return self


class ResourceRequirements(Model):
    """Container resources (Kubernetes quantities), besides the GPUs."""

    requests: Annotated[dict[str, str], Field(description="Requested resources, e.g. cpu: '4'.")] = Field(
        default_factory=dict
    )
    limits: Annotated[dict[str, str], Field(description="Resource limits.")] = Field(default_factory=dict)


class Toleration(Model):
    """A pod toleration."""

    key: Annotated[str | None, Field(description="Taint key.")] = None
    operator: Annotated[Literal["Exists", "Equal"] | None, Field(description="Exists or Equal.")] = None
    value: Annotated[str | None, Field(description="Taint value.")] = None
    effect: Annotated[
        Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None, Field(description="Taint effect.")
    ] = None
    toleration_seconds: Annotated[int | None, Field(description="For NoExecute.")] = None


class Batching(Model):
    """Triton dynamic batching settings (also the tuner's knobs)."""

    cel = (
        (
            "self.preferredBatchSizes.all(s, s <= self.maxBatchSize)",
            "every preferredBatchSizes entry must be <= maxBatchSize",
            ".preferredBatchSizes",
        ),
    )

    max_batch_size: Annotated[int, Field(ge=1, le=MAX_BATCH_SIZE, description="Triton max_batch_size.")] = 8
    preferred_batch_sizes: Annotated[
        list[Annotated[int, Field(ge=1, le=MAX_BATCH_SIZE)]],
        Field(max_length=16, description="Triton preferred_batch_size list."),
    ] = Field(default_factory=list)
    max_queue_delay_microseconds: Annotated[
        int, Field(ge=0, le=1_000_000, description="Triton max_queue_delay_microseconds.")
    ] = 0

    @model_validator(mode="after")
    def _preferred_le_max(self) -> Batching:
        for s in self.preferred_batch_sizes:
            if s > self.max_batch_size:
                raise ValueError(f"preferredBatchSizes entry {s} must be <= maxBatchSize {self.max_batch_size}")
        return self


class QueuePolicy(Model):
    """Triton's default queue policy: bounded queue, request timeout."""

    max_queue_size: Annotated[int, Field(ge=0, le=1_000_000, description="0 = unbounded.")] = 0
    timeout_microseconds: Annotated[int, Field(ge=0, description="0 = no timeout.")] = 0


SHEDDING_WITH_TIMEOUT = (
    "serving.shedding.enabled sets Triton's queue timeout from the SLO: leave serving.queuePolicy.timeoutMicroseconds "
    "at 0, or turn shedding off to keep a timeout of your own"
)


class Shedding(Model):
    """Opt-in load shedding: Triton rejects a request at once when it can no longer be answered within the SLO."""

    enabled: Annotated[
        bool,
        Field(
            description="Set Triton's default queue policy to reject (timeout_action REJECT) a request whose queue "
            "wait passes slo.latencyMs minus what its batch can still take: serving.instancesPerGpu x the engine's "
            "measured service time at the max batch in force (status.serviceTime, the build's points) and 10 % more "
            "for its spread, never below a light load's wait (the batch delay and one single-request batch); the "
            "whole SLO while no time is measured. Recomputed with every batching change (it reloads with it). A "
            "rejected request gets an error at once instead of a late answer, and counts in Triton's "
            "nv_inference_request_failure, not in the latency. Off: a request waits as long as it takes."
        ),
    ] = False


BatchSchedulerPolicy = Literal["max_utilization", "guaranteed_no_evict"]


class LlmServing(Model):
    """Triton's tensorrt_llm model config of a generative model, read at model load (a change is a reload)."""

    batch_scheduler_policy: Annotated[
        BatchSchedulerPolicy,
        Field(
            description="batch_scheduler_policy: guaranteed_no_evict admits a sequence only when the KV cache "
            "holds it to its end (a started request is never paused); max_utilization packs as many as fit now and "
            "pauses some when the cache runs out. Default guaranteed_no_evict, the backend's.",
        ),
    ] = "guaranteed_no_evict"
    kv_cache_free_gpu_mem_fraction: Annotated[
        float,
        Field(
            gt=0,
            lt=1,
            description="kv_cache_free_gpu_mem_fraction: the share of the GPU memory left after loading the engine "
            "that the KV cache may take (0 < x < 1). Default 0.9, the backend's.",
        ),
    ] = 0.9
    enable_chunked_context: Annotated[
        bool,
        Field(
            description="enable_chunked_context: prefill a prompt in chunks batched with decode steps (a long "
            "prompt stalls decoding less). Needed when engine.llm.maxNumTokens < engine.llm.maxInputLen. Default "
            "false, the backend's.",
        ),
    ] = False
    max_queue_delay_microseconds: Annotated[
        int,
        Field(
            ge=0,
            le=1_000_000,  # Triton's bound, as serving.batching.maxQueueDelayMicroseconds has it
            description="dynamic_batching.max_queue_delay_microseconds: how long Triton may hold a request so that "
            "requests arriving together join one TensorRT-LLM iteration. Default 0, Triton's.",
        ),
    ] = 0
    max_queue_size: Annotated[
        int,
        Field(
            ge=0,
            le=1_000_000,
            description="dynamic_batching.default_queue_policy.max_queue_size: requests queued before Triton "
            "rejects new ones; 0 = unbounded, Triton's default.",
        ),
    ] = 0


class Serving(Model):
    """How Triton is deployed."""

    cel = (
        (
            "!self.shedding.enabled || self.queuePolicy.timeoutMicroseconds == 0",
            SHEDDING_WITH_TIMEOUT,
            ".shedding.enabled",
        ),
    )

    triton_image: Annotated[str, Field(min_length=1, description="Triton Inference Server image.")] = (
        DEFAULT_TRITON_IMAGE
    )
    replicas: Annotated[Replicas, Field(description="Replica bounds.")] = Replicas()
    gpu: Annotated[Gpu, Field(description="GPU product and count per pod.")]
    instances_per_gpu: Annotated[
        int, Field(ge=1, le=MAX_INSTANCES_PER_GPU, description="Triton model instances per GPU.")
    ] = 1
    batching: Annotated[Batching, Field(description="Initial dynamic batching; the tuner moves it.")] = Batching()
    queue_policy: Annotated[QueuePolicy, Field(description="Triton queue policy.")] = QueuePolicy()
    shedding: Annotated[
        Shedding, Field(description="Load shedding: reject what can no longer meet the SLO (off by default).")
    ] = Shedding()
    resources: Annotated[ResourceRequirements, Field(description="CPU/memory resources.")] = ResourceRequirements()
    node_selector: Annotated[dict[str, str], Field(description="Extra node selector.")] = Field(default_factory=dict)
    tolerations: Annotated[list[Toleration], Field(description="Pod tolerations.")] = Field(default_factory=list)
    affinity: Annotated[
        dict[str, Any] | None, Field(description="Pod affinity (Kubernetes Affinity object, passed through).")
    ] = None
    pod_annotations: Annotated[dict[str, str], Field(description="Annotations added to serving pods.")] = Field(
        default_factory=dict
    )
    llm: Annotated[
        LlmServing | None,
        Field(
            description="Generative models (spec.model.kind generative) only: Triton's tensorrt_llm model config "
            "(decoupled, inflight fused batching). Read at model load: a change reloads the model through the "
            "canary. Unset on a generative model: the backend's defaults.",
        ),
    ] = None

    @model_validator(mode="after")
    def _shedding_owns_the_timeout(self) -> Serving:
        if self.shedding.enabled and self.queue_policy.timeout_microseconds != 0:
            raise ValueError(SHEDDING_WITH_TIMEOUT)
        return self


class Warmup(Model):
    """Triton model_warmup: the pod is Ready only after these ran."""

    batch_sizes: Annotated[
        list[Annotated[int, Field(ge=1, le=MAX_BATCH_SIZE)]],
        Field(max_length=16, description="One warmup sample per batch size."),
    ] = Field(default_factory=lambda: [1])
    count: Annotated[int, Field(ge=1, le=100, description="Runs per sample.")] = 2
    data: Annotated[Literal["zero", "random"], Field(description="Warmup input data.")] = "zero"


class SloTarget(Model):
    """A further latency target beside the primary one, e.g. P50 <= 8 ms."""

    percentile: Annotated[float, Field(ge=50, le=99.99, description="Percentile the target applies to.")]
    latency_ms: Annotated[float, Field(gt=0, le=600_000, description="Latency target in milliseconds.")]


class TokenTarget(Model):
    """A generative service's target on one token latency, e.g. P99 TTFT <= 500 ms."""

    target_ms: Annotated[float, Field(gt=0, le=600_000, description="Target in milliseconds.")]
    percentile: Annotated[
        float, Field(ge=50, le=99.9, description="Percentile the target applies to (P50 to P99.9).")
    ] = 99


class Slo(Model):
    """The latency objective: a primary percentile target, and optionally further ones (all kept)."""

    cel = (
        (
            "self.targets.all(t, t.percentile != self.percentile)",
            "slo.targets must not repeat the primary percentile (slo.percentile)",
            ".targets",
        ),
        (
            "self.targets.all(a, self.targets.exists_one(b, b.percentile == a.percentile))",
            "each percentile may appear once in slo.targets",
            ".targets",
        ),
    )

    latency_ms: Annotated[float, Field(gt=0, le=600_000, description="Latency objective in milliseconds.")]
    percentile: Annotated[float, Field(ge=50, le=99.99, description="Percentile the objective applies to.")] = 99
    window_seconds: Annotated[int, Field(ge=10, le=3600, description="Evaluation window.")] = 60
    targets: Annotated[
        list[SloTarget],
        Field(
            max_length=8,
            description="Further targets over the same window, e.g. [{percentile: 50, latencyMs: 8}]; the tuner "
            "keeps all of them (the tightest binds) and SLOMet is False when any is missed.",
        ),
    ] = Field(default_factory=list)
    ttft: Annotated[
        TokenTarget | None,
        Field(
            description="Generative services (spec.model.kind generative) only, and required there: time to the "
            "first token (queue wait and the prompt's prefill), e.g. {targetMs: 500, percentile: 99}."
        ),
    ] = None
    tpot: Annotated[
        TokenTarget | None,
        Field(
            description="Generative services (spec.model.kind generative) only, and required there: time per "
            "output token after the first (the decode step), e.g. {targetMs: 30, percentile: 99}."
        ),
    ] = None

    @model_validator(mode="after")
    def _distinct_percentiles(self) -> Slo:
        seen = [self.percentile, *(t.percentile for t in self.targets)]
        if len(set(seen)) != len(seen):
            raise ValueError("slo.targets must not repeat a percentile (nor the primary slo.percentile)")
        return self

    def all_targets(self) -> tuple[tuple[float, float], ...]:
        """(percentile, ms) of every target, the primary first, then the others by percentile."""
        others = sorted((t.percentile, t.latency_ms) for t in self.targets)
        return ((self.percentile, self.latency_ms), *others)

    def other_targets(self) -> tuple[tuple[float, float], ...]:
        """(percentile, ms) of the targets beside the primary, by percentile."""
        return self.all_targets()[1:]


class IntRange(Model):
    """An inclusive integer range."""

    cel = (("self.min <= self.max", "min must be <= max", None),)

    min: Annotated[int, Field(ge=0, description="Lower bound.")]
    max: Annotated[int, Field(ge=0, description="Upper bound.")]

    @model_validator(mode="after")
    def _min_le_max(self) -> IntRange:
        if self.min > self.max:
            raise ValueError("min must be <= max")
        return self


# Triton's own bound, as serving.batching.maxQueueDelayMicroseconds has it: the tuner must stay within it.
MAX_QUEUE_DELAY_US = 1_000_000
# spec.tuning.targetUtilization. The default: the utilisation a replica is planned at, 15 % of its capacity
# kept for what the demand's margin did not see (0.85, the queueing headroom the tuner has used since v1). Above
# 0.95 a backlog drains at a twentieth of a replica's capacity or less (it drains at 1 - utilisation): a surge of
# seconds leaves minutes of queue. Below 0.5 half of every replica is idle by plan: replicas.min is the knob there.
DEFAULT_TARGET_UTILIZATION = 0.85
MIN_TARGET_UTILIZATION = 0.5
MAX_TARGET_UTILIZATION = 0.95
PREFERRED_ABOVE_TUNING_MAX = (
    "every tuning.preferredBatchSizes entry must be <= tuning.maxBatchSize.max (a larger size could never be "
    "used): remove it or raise tuning.maxBatchSize.max"
)
DELAY_ABOVE_CAP = (
    f"tuning.queueDelayMicroseconds.max must be <= {MAX_QUEUE_DELAY_US} (1 s, the most Triton's "
    "max_queue_delay_microseconds takes here): lower it"
)


class Forecast(Model):
    """Opt-in scale-out ahead of demand that repeats."""

    enabled: Annotated[
        bool,
        Field(
            description="Keep the demand per tuning interval (up to 480 intervals) and, where it repeats with a "
            "period (autocorrelation), scale out ahead of the predicted rise by the measured pod start. It only "
            "adds replicas or keeps them up for a predicted rise; scale-in stays on the measured demand. Off: the "
            "tuner scales on the measured demand alone."
        ),
    ] = False


class Tuning(Model):
    """The SLO autotuner."""

    cel = (
        (
            "self.preferredBatchSizes.all(s, s <= self.maxBatchSize.max)",
            PREFERRED_ABOVE_TUNING_MAX,
            ".preferredBatchSizes",
        ),
        (f"self.queueDelayMicroseconds.max <= {MAX_QUEUE_DELAY_US}", DELAY_ABOVE_CAP, ".queueDelayMicroseconds.max"),
    )

    enabled: Annotated[bool, Field(description="Tune batching and replicas from the observed latency.")] = True
    mode: Annotated[
        Literal["hot", "rolling"],
        Field(description="hot: reload the model config in every pod; rolling: roll the Deployment."),
    ] = "hot"
    interval_seconds: Annotated[int, Field(ge=5, le=3600, description="How often the tuner decides.")] = 30
    cooldown_seconds: Annotated[
        int, Field(ge=0, le=86400, description="Least time between two config changes (reloads cost).")
    ] = 60
    max_batch_size: Annotated[IntRange, Field(description="Bounds of max_batch_size.")] = IntRange(min=1, max=32)
    queue_delay_microseconds: Annotated[IntRange, Field(description="Bounds of the queue delay.")] = IntRange(
        min=0, max=10_000
    )
    preferred_batch_sizes: Annotated[
        list[Annotated[int, Field(ge=1, le=MAX_BATCH_SIZE)]],
        Field(max_length=16, description="Candidate preferred sizes; empty lets the tuner choose."),
    ] = Field(default_factory=list)
    max_batch_step: Annotated[
        int, Field(ge=1, le=64, description="Largest change of max_batch_size in one decision.")
    ] = 8
    max_delay_step_microseconds: Annotated[
        int, Field(ge=1, description="Largest change of the queue delay in one decision.")
    ] = 2000
    headroom: Annotated[float, Field(gt=0, lt=1, description="Aim P99 at this share of the SLO (hysteresis band).")] = (
        0.8
    )
    target_utilization: Annotated[
        float,
        Field(
            ge=MIN_TARGET_UTILIZATION,
            le=MAX_TARGET_UTILIZATION,
            description="Share of a replica's capacity the tuner plans it to carry (as the HPA's target "
            "utilization): higher costs fewer replica-seconds and leaves less room for a rise the demand's measured "
            "margin did not see; the planned latency stays within the aim either way. Not read for a generative "
            "model (its replicas are sized on TTFT and TPOT).",
        ),
    ] = DEFAULT_TARGET_UTILIZATION
    keep_spec_start: Annotated[
        bool,
        Field(
            description="Serve spec.serving.batching first even where the engine build's measured curve shows it "
            "fragile (the tuner moves it once traffic shows it). Default false: a fragile start batching is left "
            "before the first pod serves, so no reload lands on the first requests."
        ),
    ] = False
    forecast: Annotated[Forecast, Field(description="Scale out ahead of demand that repeats.")] = Forecast()

    @model_validator(mode="after")
    def _rules(self) -> Tuning:
        if any(s > self.max_batch_size.max for s in self.preferred_batch_sizes):
            raise ValueError(PREFERRED_ABOVE_TUNING_MAX)
        if self.queue_delay_microseconds.max > MAX_QUEUE_DELAY_US:
            raise ValueError(DELAY_ABOVE_CAP)
        return self


class Metrics(Model):
    """Where the tuner reads latency."""

    prometheus_url: Annotated[str, Field(pattern=r"^https?://[^\s]+$", description="Prometheus base URL.")] = (
        "http://prometheus-operated.monitoring.svc:9090"
    )
    latency_query: Annotated[
        str | None,
        Field(
            max_length=4096,
            description="PromQL returning the latency in seconds at the SLO percentile; may use {namespace}, "
            "{name}, {model}, {window}, and {quantile} (0.99) or {percentile} (99) to serve slo.targets too "
            "(without them the further targets come from Triton's metrics). Defaults to Triton's own metrics.",
        ),
    ] = None
    timeout_seconds: Annotated[float, Field(gt=0, le=60, description="Timeout of every Prometheus query, seconds.")] = (
        3.0
    )


GENERATIVE_WITHOUT_TOKEN_TARGETS = (
    "spec.model.kind generative needs spec.slo.ttft and spec.slo.tpot: set both, e.g. "
    "ttft: {targetMs: 500, percentile: 99} and tpot: {targetMs: 30, percentile: 99}"
)
TOKEN_TARGETS_WITHOUT_GENERATIVE = (
    "spec.slo.ttft and spec.slo.tpot apply to generative services only: remove them, or set spec.model.kind: generative"
)
LLM_FIELDS_WITHOUT_GENERATIVE = (
    "spec.engine.llm and spec.serving.llm apply to generative services only: remove them, or set "
    "spec.model.kind: generative"
)
GENERATIVE_NOT_TENSORRT = (
    "spec.model.kind generative builds a TensorRT-LLM engine: leave spec.engine.backend at tensorrt"
)
PROMPT_ABOVE_TOKEN_BUDGET = (
    "spec.engine.llm.maxNumTokens must be >= spec.engine.llm.maxInputLen unless spec.serving.llm.enableChunkedContext "
    "is true (without chunks a whole prompt is prefilled in one iteration): raise maxNumTokens, lower maxInputLen, "
    "or enable chunked context"
)


class InferenceServiceSpec(Model):
    """Desired state of an InferenceService."""

    cel = (
        (
            "self.tuning.maxBatchSize.max <= self.engine.optimizationProfile.max",
            "tuning.maxBatchSize.max must be <= engine.optimizationProfile.max (the engine's max batch)",
            ".tuning.maxBatchSize.max",
        ),
        (
            "self.serving.batching.maxBatchSize <= self.engine.optimizationProfile.max",
            "serving.batching.maxBatchSize must be <= engine.optimizationProfile.max (the engine's max batch)",
            ".serving.batching.maxBatchSize",
        ),
        (
            "self.warmup.batchSizes.all(b, b <= self.serving.batching.maxBatchSize)",
            "every warmup.batchSizes entry must be <= serving.batching.maxBatchSize",
            ".warmup.batchSizes",
        ),
        (
            "!has(self.model.kind) || self.model.kind != 'generative' || (has(self.slo.ttft) && has(self.slo.tpot))",
            GENERATIVE_WITHOUT_TOKEN_TARGETS,
            ".slo",
        ),
        (
            "(has(self.model.kind) && self.model.kind == 'generative') || (!has(self.slo.ttft) && !has(self.slo.tpot))",
            TOKEN_TARGETS_WITHOUT_GENERATIVE,
            ".slo",
        ),
        (
            "(has(self.model.kind) && self.model.kind == 'generative')"
            " || (!has(self.engine.llm) && !has(self.serving.llm))",
            LLM_FIELDS_WITHOUT_GENERATIVE,
            ".model.kind",
        ),
        (
            "!has(self.model.kind) || self.model.kind != 'generative' || self.engine.backend == 'tensorrt'",
            GENERATIVE_NOT_TENSORRT,
            ".engine.backend",
        ),
        (
            "!has(self.engine.llm) || self.engine.llm.maxNumTokens >= self.engine.llm.maxInputLen"
            " || (has(self.serving.llm) && self.serving.llm.enableChunkedContext)",
            PROMPT_ABOVE_TOKEN_BUDGET,
            ".engine.llm.maxNumTokens",
        ),
    )

    model: Annotated[ModelSource, Field(description="The model to serve.")]
    engine: Annotated[Engine, Field(description="Engine build.")] = Engine()
    serving: Annotated[Serving, Field(description="Triton deployment.")]
    warmup: Annotated[Warmup, Field(description="Model warmup before Ready.")] = Warmup()
    slo: Annotated[Slo, Field(description="Latency objective.")]
    tuning: Annotated[Tuning, Field(description="Autotuner.")] = Tuning()
    metrics: Annotated[Metrics, Field(description="Latency signal.")] = Metrics()

    @model_validator(mode="after")
    def _cross_field(self) -> InferenceServiceSpec:
        engine_max = self.engine.optimization_profile.max
        if self.tuning.max_batch_size.max > engine_max:
            raise ValueError(
                "tuning.maxBatchSize.max must be <= engine.optimizationProfile.max (the engine's max batch)"
            )
        if self.serving.batching.max_batch_size > engine_max:
            raise ValueError(
                "serving.batching.maxBatchSize must be <= engine.optimizationProfile.max (the engine's max batch)"
            )
        for b in self.warmup.batch_sizes:
            if b > self.serving.batching.max_batch_size:
                raise ValueError("every warmup.batchSizes entry must be <= serving.batching.maxBatchSize")
        token_targets = (self.slo.ttft, self.slo.tpot)
        if self.model.kind == "generative" and None in token_targets:
            raise ValueError(GENERATIVE_WITHOUT_TOKEN_TARGETS)
        if self.model.kind != "generative" and token_targets != (None, None):
            raise ValueError(TOKEN_TARGETS_WITHOUT_GENERATIVE)
        if self.model.kind != "generative" and (self.engine.llm is not None or self.serving.llm is not None):
            raise ValueError(LLM_FIELDS_WITHOUT_GENERATIVE)
        if self.model.kind == "generative" and self.engine.backend != "tensorrt":
            raise ValueError(GENERATIVE_NOT_TENSORRT)
        if self.llm_engine().needs_chunked_context and not self.llm_serving().enable_chunked_context:
            raise ValueError(PROMPT_ABOVE_TOKEN_BUDGET)
        return self

    def llm_engine(self) -> LlmEngine:
        """The TensorRT-LLM engine's limits: spec.engine.llm, or trtllm-build's defaults where it is unset."""
        return self.engine.llm or LlmEngine()

    def llm_serving(self) -> LlmServing:
        """The tensorrt_llm model config's settings: spec.serving.llm, or the backend's defaults where it is unset."""
        return self.serving.llm or LlmServing()


class Condition(Model):
    """A Kubernetes-style condition."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)

    type: Annotated[str, Field(description="EngineReady, ServingReady, SLOMet or Ready.")]
    status: Annotated[Literal["True", "False", "Unknown"], Field(description="Condition status.")]
    reason: Annotated[str, Field(description="CamelCase reason.")] = ""
    message: Annotated[str, Field(description="Human-readable detail.")] = ""
    last_transition_time: Annotated[str | None, Field(description="RFC 3339 time of the last change.")] = None
    observed_generation: Annotated[int | None, Field(description="Generation the condition judged.")] = None


class EngineStatus(Model):
    """The engine in use."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)

    cache_key: Annotated[str | None, Field(description="Engine cache key (also the build Job's name).")] = None
    location: Annotated[str | None, Field(description="Where the engine lives in the store.")] = None
    tensorrt_version: Annotated[str | None, Field(description="TensorRT version of the engine.")] = None
    gpu_product: Annotated[str | None, Field(description="GPU product the engine was built on.")] = None
    job_name: Annotated[str | None, Field(description="Build Job name.")] = None
    model_digest: Annotated[
        str | None,
        Field(description="sha256:<hex> of the model bytes the engine was built from, as the build read them."),
    ] = None
    engine_bytes: Annotated[
        int | None,
        Field(
            ge=0,
            description="Size of the built engine file in bytes (a hot reload needs this much free GPU memory "
            "for the second copy).",
        ),
    ] = None
    inputs: Annotated[list[TensorSpec], Field(description="Engine inputs the build reported.")] = Field(
        default_factory=list
    )
    outputs: Annotated[list[TensorSpec], Field(description="Engine outputs the build reported.")] = Field(
        default_factory=list
    )


class Endpoints(Model):
    """In-cluster endpoints."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)

    http: Annotated[str | None, Field(description="KServe v2 HTTP endpoint.")] = None
    grpc: Annotated[str | None, Field(description="KServe v2 gRPC endpoint.")] = None


class ReplicaStatus(Model):
    """Replica counts."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)

    desired: Annotated[int, Field(description="Replicas the operator asks for.")] = 0
    ready: Annotated[int, Field(description="Ready serving pods.")] = 0


class BatchingStatus(Model):
    """The batching config in force."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)

    max_batch_size: Annotated[int | None, Field(description="Triton max_batch_size.")] = None
    preferred_batch_sizes: Annotated[list[int], Field(description="Preferred sizes.")] = Field(default_factory=list)
    max_queue_delay_microseconds: Annotated[int | None, Field(description="Queue delay.")] = None
    last_change_time: Annotated[str | None, Field(description="When the tuner last changed it.")] = None
    reason: Annotated[str | None, Field(description="Why.")] = None


class RolloutStatus(Model):
    """A batching rollout in flight: the canary pod runs this config while the other pods run `status.batching`."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)

    canary: Annotated[str | None, Field(description="The canary pod's IP.")] = None
    stage: Annotated[
        str | None, Field(description="canary (judged over its window), promoting (to the other pods) or rolling-back.")
    ] = None
    max_batch_size: Annotated[int | None, Field(description="Triton max_batch_size the canary runs.")] = None
    preferred_batch_sizes: Annotated[list[int], Field(description="Preferred sizes the canary runs.")] = Field(
        default_factory=list
    )
    max_queue_delay_microseconds: Annotated[int | None, Field(description="Queue delay the canary runs.")] = None
    since: Annotated[str | None, Field(description="When the canary took this config.")] = None
    reason: Annotated[str | None, Field(description="Why the tuner tries it.")] = None
    llm: Annotated[
        LlmServing | None,
        Field(description="A generative model's rollout: the tensorrt_llm load-time settings the canary runs."),
    ] = None


class TargetStatus(Model):
    """One latency target against its observed value over the window."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)

    percentile: Annotated[float, Field(description="Percentile of the target.")]
    target_ms: Annotated[float, Field(description="Target, ms.")]
    observed_ms: Annotated[
        float | None, Field(description="Observed over the window, ms (empty: no data, or above every bucket).")
    ] = None
    met: Annotated[bool | None, Field(description="Observed within the target (empty: not judged).")] = None


class BatchCount(Model):
    """How many batches of one size Triton executed over the window."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)

    batch: Annotated[int, Field(description="Batch size.")]
    count: Annotated[int, Field(description="Executions of that size.")]
    ms: Annotated[float | None, Field(description="Mean execution time of one such batch, ms.")] = None


class LatencyBreakdown(Model):
    """Where a request's time goes, mean ms per request over the window, from Triton's counters summed over pods."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)

    queue_ms: Annotated[float | None, Field(description="Queue and batching wait.")] = None
    compute_input_ms: Annotated[float | None, Field(description="Copying inputs to the device.")] = None
    compute_infer_ms: Annotated[float | None, Field(description="Executing the model.")] = None
    compute_output_ms: Annotated[float | None, Field(description="Copying outputs back.")] = None
    rest_ms: Annotated[float | None, Field(description="Triton's request time outside these steps.")] = None
    request_ms: Annotated[float | None, Field(description="Triton's whole request time.")] = None
    mean_batch: Annotated[float | None, Field(description="Mean batch size executed.")] = None
    batches: Annotated[
        list[BatchCount], Field(description="Batch sizes executed over the tuner's last interval (batch stats).")
    ] = Field(default_factory=list)
    server_ms: Annotated[
        float | None, Field(description="Triton's own latency at the SLO percentile (with metrics.latencyQuery).")
    ] = None
    outside_ms: Annotated[
        float | None,
        Field(
            description="metrics.latencyQuery's figure minus Triton's own at the SLO percentile: time outside "
            "Triton (network, client, gateway, pre/post-processing)."
        ),
    ] = None


class LatencyStatus(Model):
    """Last observation of the latency signal."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)

    observed_ms: Annotated[float | None, Field(description="Latency at the SLO percentile, ms.")] = None
    percentile: Annotated[float | None, Field(description="Percentile observed.")] = None
    throughput_rps: Annotated[float | None, Field(description="Requests per second.")] = None
    observed_at: Annotated[str | None, Field(description="When it was observed.")] = None
    window_start: Annotated[str | None, Field(description="Oldest instant the figure can reflect (RFC 3339).")] = None
    window_end: Annotated[str | None, Field(description="Newest sample behind the figure (RFC 3339).")] = None
    source: Annotated[
        Literal["tritonSummary", "histogram", "userQuery"] | None,
        Field(
            description="tritonSummary: Triton's summary per pod, max over pods (fixed 60 s window, only the "
            "configured quantiles); histogram: histogram_quantile over the summed buckets; userQuery: "
            "metrics.latencyQuery."
        ),
    ] = None
    overlaps_change: Annotated[
        bool | None, Field(description="The window reaches back before the last config change (settling).")
    ] = None
    above_range: Annotated[
        bool | None, Field(description="The quantile lies above every histogram bucket (+Inf): over any SLO.")
    ] = None
    clean_ms: Annotated[
        float | None, Field(description="Latency of the latest window that does not overlap a change, ms.")
    ] = None
    clean_window_end: Annotated[str | None, Field(description="End of that window (RFC 3339).")] = None
    problem: Annotated[
        str | None,
        Field(
            description="Why the signal cannot be judged: PrometheusUnavailable, QueryAmbiguous, NoTraffic, "
            "NoLatencyData; or why the tuner holds on it: ClockSkew, SignalStale, SignalImplausible (the window is "
            "refused and its figures withheld), SignalMissing (no request rate or too few samples)."
        ),
    ] = None
    message: Annotated[str | None, Field(description="Detail of the problem or of the window.")] = None
    infeasible: Annotated[
        str | None, Field(description="The tuner's SLOInfeasible reason (demand beyond the bounds), if any.")
    ] = None
    targets: Annotated[
        list[TargetStatus], Field(description="Every target of spec.slo (the primary first) against its figure.")
    ] = Field(default_factory=list)
    targets_summary: Annotated[
        str | None, Field(description="The targets in one line, e.g. 'P50 6.1/8 ok, P99.9 91/80 MISSED' (ms).")
    ] = None
    breakdown: Annotated[LatencyBreakdown | None, Field(description="Where the time goes over the window.")] = None


class ServiceTimePoint(Model):
    """One measured batch size of the service-time curve t(b)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)

    batch: Annotated[int, Field(ge=1, description="Batch size.")]
    ms: Annotated[float, Field(gt=0, description="Mean execution time of one batch of this size, ms.")]
    samples: Annotated[int, Field(ge=0, description="Executions the figure comes from.")] = 1
    source: Annotated[
        Literal["build", "live"],
        Field(description="build: timed by the engine-build Job; live: Triton's batch statistics."),
    ] = "build"


class ServiceTimeStatus(Model):
    """The measured service-time curve the tuner plans with, on the serving GPU product."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)

    points: Annotated[
        list[ServiceTimePoint], Field(description="Measured sizes; a size may appear once per source.")
    ] = Field(default_factory=list)
    engine_cache_key: Annotated[
        str | None, Field(description="Cache key of the engine the points were measured on.")
    ] = None
    updated_at: Annotated[str | None, Field(description="When the points last changed.")] = None


class GenerativeStatus(Model):
    """A generative service's token latencies against spec.slo.ttft/tpot, and its engine's load."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)

    ttft: Annotated[
        TargetStatus | None, Field(description="Time to the first token at spec.slo.ttft.percentile vs its target.")
    ] = None
    tpot: Annotated[
        TargetStatus | None, Field(description="Time per output token at spec.slo.tpot.percentile vs its target.")
    ] = None
    ttft_summary: Annotated[
        str | None, Field(description="TTFT in one line, observed/target ms, e.g. 'P99 412/500 ok'.")
    ] = None
    tpot_summary: Annotated[
        str | None, Field(description="TPOT in one line, observed/target ms, e.g. 'P99 24/30 ok'.")
    ] = None
    tokens_per_second: Annotated[float | None, Field(ge=0, description="Output tokens per second, all pods.")] = None
    running_sequences: Annotated[
        int | None,
        Field(ge=0, description="Sequences in the running batch, all pods (nv_trt_llm_request_metrics active)."),
    ] = None
    waiting_sequences: Annotated[
        int | None,
        Field(ge=0, description="Sequences queued for admission, all pods (nv_trt_llm_request_metrics waiting)."),
    ] = None
    kv_cache_used_percent: Annotated[
        float | None,
        Field(
            ge=0,
            le=100,
            description="KV-cache blocks in use, % of the blocks, the fullest pod (nv_trt_llm_kv_cache_block_metrics).",
        ),
    ] = None
    serving: Annotated[
        LlmServing | None,
        Field(
            description="The tensorrt_llm load-time settings in force (spec.serving.llm, or the generative tuner's "
            "last promoted lever change)."
        ),
    ] = None
    serving_reason: Annotated[
        str | None,
        Field(description="Why those settings are in force: the tuner's lever change and its canary's verdict."),
    ] = None


class InferenceServiceStatus(Model):
    """Observed state, written by the operator only."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)

    observed_generation: Annotated[int | None, Field(description="Generation last reconciled.")] = None
    conditions: Annotated[list[Condition], Field(description="Conditions.")] = Field(default_factory=list)
    engine: Annotated[EngineStatus, Field(description="Engine.")] = EngineStatus()
    endpoints: Annotated[Endpoints, Field(description="Endpoints.")] = Endpoints()
    replicas: Annotated[ReplicaStatus, Field(description="Replicas.")] = ReplicaStatus()
    batching: Annotated[BatchingStatus, Field(description="Batching in force.")] = BatchingStatus()
    rollout: Annotated[
        RolloutStatus,
        Field(description="The batching rollout in flight: the canary and the config it runs (empty: none)."),
    ] = RolloutStatus()
    latency: Annotated[LatencyStatus, Field(description="Latency signal.")] = LatencyStatus()
    service_time: Annotated[ServiceTimeStatus, Field(description="Measured service-time curve t(b).")] = (
        ServiceTimeStatus()
    )
    generative: Annotated[
        GenerativeStatus,
        Field(description="Token latencies and engine load of a generative service (empty for request services)."),
    ] = GenerativeStatus()


class ObjectMeta(BaseModel):
    """The few metadata fields the operator reads."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True)

    name: str
    namespace: str = "default"
    uid: str = ""
    generation: int = 0
    resource_version: str = Field(default="", alias="resourceVersion")
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    creation_timestamp: datetime | None = Field(default=None, alias="creationTimestamp")


class InferenceService(BaseModel):
    """A whole InferenceService object as read from the API server."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True)

    api_version: str = Field(default=API_VERSION, alias="apiVersion")
    kind: str = KIND
    metadata: ObjectMeta
    spec: InferenceServiceSpec
    status: InferenceServiceStatus = InferenceServiceStatus()

    @property
    def model_name(self) -> str:
        """Model name inside Triton."""
        return self.spec.model.name or self.metadata.name
