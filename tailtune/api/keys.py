"""The names tailtune writes on objects and the ports Triton serves on: one home for each.

Annotation and label keys under our own prefix, the recommended `app.kubernetes.io/*` labels, the GPU
keys the NVIDIA device plugin and GPU feature discovery use, and Triton's three ports. Stdlib only, so
every layer (operator, builders, triton, engine builder, devkit) may import it.
"""

from __future__ import annotations

# Our prefix: the API group, also the prefix of kopf's progress annotations.
PREFIX = "tailtune.io"
MANAGED_BY = "tailtune"

# Recommended labels (`instance` + `component` select the pods).
NAME_LABEL = "app.kubernetes.io/name"
INSTANCE_LABEL = "app.kubernetes.io/instance"
COMPONENT_LABEL = "app.kubernetes.io/component"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
PART_OF_LABEL = "app.kubernetes.io/part-of"
# Set by the Job controller on the pods of a Job.
JOB_NAME_LABEL = "job-name"

# The engine cache key: a label on the build Job and its pod, an annotation on the Triton pod template.
ENGINE_KEY = f"{PREFIX}/engine-key"
# On the Triton pod template: a digest of the model config it was rolled for (a change rolls the pods).
CONFIG_HASH_ANNOTATION = f"{PREFIX}/config-hash"
# On the Deployment: a digest of all serving objects last applied (an unchanged one needs no apply).
DESIRED_HASH_ANNOTATION = f"{PREFIX}/desired-hash"
# On the InferenceService: the config in force, and the tuner's state (both survive operator restarts).
APPLIED_ANNOTATION = f"{PREFIX}/applied"
TUNER_STATE_ANNOTATION = f"{PREFIX}/tuner-state"
# On the InferenceService: a batching rollout in flight (canary, target, previous), resumed after a restart.
ROLLOUT_ANNOTATION = f"{PREFIX}/rollout"
# kopf's diff base, under PREFIX (kopf joins the two).
LAST_HANDLED_KEY = "last-handled-configuration"

# Prometheus' scrape annotations on the Triton pods.
SCRAPE_ANNOTATION = "prometheus.io/scrape"
SCRAPE_PORT_ANNOTATION = "prometheus.io/port"
SCRAPE_PATH_ANNOTATION = "prometheus.io/path"

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_RESOURCE = "nvidia.com/gpu"

# Triton's ports. Model control goes over gRPC: Triton 2.51 runs an HTTP load on its HTTP event loop,
# stalling inference.
HTTP_PORT = 8000
GRPC_PORT = 8001
METRICS_PORT = 8002
