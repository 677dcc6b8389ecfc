"""onnx's own BackendTest, unchanged, against oar.onnx's Backend on the CPU reference plugin: a fast
sample of the node cases in CI (the whole set is the conformance level ``onnx``)."""

from __future__ import annotations

import os
import warnings

import pytest

onnx_backend_test = pytest.importorskip("onnx.backend.test")

# one or more cases per op family, chosen to cover lowering paths (each runs in well under a second)
SAMPLE = [
    "test_abs", "test_add_bcast", "test_sub_bcast", "test_div", "test_pow", "test_mod_mixed_sign_float32",
    "test_matmul_3d", "test_gemm_all_attributes", "test_conv_with_strides_and_asymmetric_padding",
    "test_maxpool_2d_pads", "test_averagepool_2d_pads", "test_globalaveragepool", "test_relu",
    "test_leakyrelu", "test_gelu_tanh_1", "test_softmax_axis_0", "test_logsoftmax_axis_1",
    "test_reduce_sum_keepdims_random", "test_reduce_mean_default_axes_keepdims_random",
    "test_reduce_max_bool_inputs", "test_argmax_keepdims_example_select_last_index",
    "test_reshape_reordered_all_dims", "test_transpose_all_permutations_0", "test_slice_neg_steps",
    "test_concat_3d_axis_negative_1", "test_split_equal_parts_1d_opset18", "test_gather_negative_indices",
    "test_gather_elements_1", "test_scatter_elements_with_axis", "test_where_example", "test_expand_dim_changed",
    "test_tile", "test_constant_pad", "test_edge_pad", "test_reflect_pad", "test_layer_normalization_4d_axis_negative_2",
    "test_batchnorm_example", "test_instancenorm_example", "test_cumsum_1d_reverse_exclusive",
    "test_einsum_batch_matmul", "test_triu_pos", "test_tril_neg", "test_triu_out_pos", "test_onehot_with_axis",
    "test_cast_FLOAT_to_DOUBLE", "test_shape_start_1", "test_range_float_type_positive_delta",
    "test_constantofshape_int_zeros", "test_if", "test_loop11", "test_scan9_sum", "test_attention_4d_causal",
    "test_nllloss_NCd1d2_with_weight_reduction_mean", "test_sce_mean_weight", "test_round", "test_floor",
    "test_lrn", "test_spacetodepth_example", "test_spacetodepth_crd_mode_example",
]


@pytest.fixture(scope="module", autouse=True)
def _refcpu_as_device(dev):
    os.environ["OAR_ONNX_DEVICE"] = dev
    yield
    os.environ.pop("OAR_ONNX_DEVICE", None)


def _backend_test():
    from oar.onnx.backend import OarBackend

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        backend_test = onnx_backend_test.BackendTest(OarBackend, __name__)
    return backend_test


def _sampled_test_cases() -> dict:
    """onnx's test classes with only the sampled cases left in them: cases outside the sample are
    left out, not collected as skipped (the whole set runs in the conformance level)."""
    wanted = {f"{name}_cpu" for name in SAMPLE}
    cases = _backend_test().test_cases
    for test_class in cases.values():
        for attribute in [a for a in vars(test_class) if a.startswith("test_") and a not in wanted]:
            delattr(test_class, attribute)
    found = {a for test_class in cases.values() for a in vars(test_class) if a.startswith("test_")}
    assert wanted <= found, f"sampled cases onnx no longer has: {sorted(wanted - found)}"
    return cases


globals().update(_sampled_test_cases())
