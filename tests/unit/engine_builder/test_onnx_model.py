"""ONNX inspection on small models built in code, and what each backend refuses."""

from __future__ import annotations

import pytest

from tailtune.engine_builder.errors import BuildError, Failure
from tailtune.engine_builder.onnx_model import DYNAMIC, ModelInfo, TensorInfo, check_servable, load_model_info

from .conftest import Models


def test_dynamic_batch_model(models: Models) -> None:
    info = load_model_info(models.dynamic)
    assert info.inputs == (TensorInfo("x", "FLOAT", (DYNAMIC, 4)),)
    assert info.outputs == (TensorInfo("y", "FLOAT", (DYNAMIC, 4)),)
    assert info.opset == 17
    assert info.op_types == frozenset({"Relu"})
    assert info.inputs[0].to_json() == {"name": "x", "dtype": "TYPE_FP32", "onnxDtype": "FLOAT", "dims": [-1, 4]}
    check_servable(info, backend="tensorrt", max_batch=32, dim_ranges={})


def test_several_inputs_with_their_dtypes_and_dims(models: Models) -> None:
    info = load_model_info(models.multi)
    assert [(t.name, t.triton_dtype, t.dims) for t in info.inputs] == [
        ("a", "TYPE_FP32", (DYNAMIC, 3)),
        ("b", "TYPE_INT64", (DYNAMIC, 2)),
        ("mask", "TYPE_BOOL", (DYNAMIC, DYNAMIC)),
    ]
    assert [t.name for t in info.outputs] == ["ra", "ib", "nm"]
    check_servable(info, backend="onnxruntime", max_batch=8, dim_ranges={})
    with pytest.raises(BuildError) as err:
        check_servable(info, backend="tensorrt", max_batch=8, dim_ranges={})
    assert err.value.failure is Failure.UNSUPPORTED_TENSOR
    assert err.value.message.startswith("input 'mask' dim 1 is dynamic")
    assert "--dim mask:1=MIN,OPT,MAX" in err.value.message
    check_servable(info, backend="tensorrt", max_batch=8, dim_ranges={("mask", 1): (1, 64, 256)})


def test_static_batch_of_one_serves_only_max_batch_one(models: Models) -> None:
    info = load_model_info(models.static1)
    assert info.inputs[0].dims == (1, 4)
    check_servable(info, backend="tensorrt", max_batch=1, dim_ranges={})
    with pytest.raises(BuildError) as err:
        check_servable(info, backend="tensorrt", max_batch=8, dim_ranges={})
    assert err.value.failure is Failure.UNSUPPORTED_TENSOR
    assert err.value.message.startswith("input 'x' dim 0 is fixed at 1, so it cannot batch up to 8")


def test_static_batch_other_than_one_is_no_batch_dim(models: Models) -> None:
    with pytest.raises(BuildError) as err:
        check_servable(load_model_info(models.static4), backend="onnxruntime", max_batch=4, dim_ranges={})
    assert err.value.failure is Failure.UNSUPPORTED_TENSOR
    assert err.value.message.startswith("input 'x' dim 0 is fixed at 4")


def test_complex_dtype_is_refused_for_every_backend(models: Models) -> None:
    info = load_model_info(models.complex64)
    for backend in ("tensorrt", "onnxruntime"):
        with pytest.raises(BuildError) as err:
            check_servable(info, backend=backend, max_batch=4, dim_ranges={})
        assert err.value.failure is Failure.UNSUPPORTED_TENSOR
        assert err.value.message == "input 'z' has dtype COMPLEX64, which Triton cannot serve"


def test_string_input_is_served_by_onnxruntime_but_not_tensorrt(models: Models) -> None:
    info = load_model_info(models.string)
    assert info.inputs[0].triton_dtype == "TYPE_STRING"
    check_servable(info, backend="onnxruntime", max_batch=4, dim_ranges={})
    with pytest.raises(BuildError) as err:
        check_servable(info, backend="tensorrt", max_batch=4, dim_ranges={})
    assert err.value.failure is Failure.UNSUPPORTED_TENSOR
    assert err.value.message.startswith("input 's' has dtype STRING, which TensorRT cannot take")


@pytest.mark.parametrize(
    ("dim", "says"),
    [
        (("x", 1), "that dim is fixed at 4"),
        (("x", 0), "no input dim like that"),
        (("nope", 1), "no input dim like that"),
    ],
)
def test_dim_ranges_must_name_a_dynamic_dim(models: Models, dim: tuple[str, int], says: str) -> None:
    with pytest.raises(BuildError) as err:
        check_servable(load_model_info(models.dynamic), backend="tensorrt", max_batch=4, dim_ranges={dim: (1, 2, 3)})
    assert err.value.failure is Failure.INVALID_ARGUMENTS
    assert says in err.value.message


def test_unshaped_and_scalar_inputs_are_refused() -> None:
    for dims, says in [(None, "has no shape"), ((), "is a scalar")]:
        info = ModelInfo(inputs=(TensorInfo("x", "FLOAT", dims),), outputs=(), opset=17, op_types=frozenset())
        with pytest.raises(BuildError, match=says):
            check_servable(info, backend="onnxruntime", max_batch=1, dim_ranges={})


@pytest.mark.parametrize(
    ("model", "failure", "says"),
    [
        ("garbage", Failure.CORRUPT_MODEL, "garbage.onnx: "),
        ("dangling", Failure.CORRUPT_MODEL, "nowhere"),
        ("unknown_op", Failure.UNSUPPORTED_OP, "No Op registered for NotAnOp"),
    ],
)
def test_models_the_checker_refuses(models: Models, model: str, failure: Failure, says: str) -> None:
    with pytest.raises(BuildError) as err:
        load_model_info(getattr(models, model))
    assert err.value.failure is failure
    assert says in err.value.message


def test_a_custom_domain_op_passes_inspection(models: Models) -> None:
    # The checker cannot know other domains; the backend decides (see the onnxruntime check).
    assert load_model_info(models.custom_op).op_types == frozenset({"com.example::Frobnicate"})
