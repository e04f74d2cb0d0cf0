"""The InferenceService API (`tailtune.io/v1alpha1`): the only schema source; `crdgen` writes `crds/`."""

from tailtune.api.v1alpha1 import (
    API_VERSION,
    GROUP,
    KIND,
    PLURAL,
    VERSION,
    Batching,
    Condition,
    InferenceService,
    InferenceServiceSpec,
    InferenceServiceStatus,
)

__all__ = [
    "API_VERSION",
    "GROUP",
    "KIND",
    "PLURAL",
    "VERSION",
    "Batching",
    "Condition",
    "InferenceService",
    "InferenceServiceSpec",
    "InferenceServiceStatus",
]
