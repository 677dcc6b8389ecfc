"""Weight-only quantization (oar.quantization): codes and scales against numpy, QuantizedLinear
against the float Linear, the Hadamard rotation (orthogonal, and what it buys on outliers),
quantize_weights on the Llama-style model, and save/load with the scheme checked."""

import numpy as np
import pytest
from opencl_subprocess import run_on_opencl

from oar.models import data


def test_codes_reconstruct_within_half_a_step():
    from oar.quantization import QuantScheme, dequantize_array, quantize_array

    w = np.random.default_rng(0).standard_normal((8, 128)).astype(np.float32)
    for bits in (8, 4):
        for symmetric in (True, False):
            scheme = QuantScheme(bits=bits, group_size=32, symmetric=symmetric)
            codes, scales, zeros = quantize_array(w, scheme)
            low, high = (-128, 127) if bits == 8 else (-8, 7)
            assert codes.dtype == np.int8 and codes.min() >= low and codes.max() <= high
            err = np.abs(dequantize_array(codes, scales, zeros, 32) - w).reshape(8, 4, 32).max(-1)
            assert np.all(err <= scales * 0.5 + 1e-6), (bits, symmetric)


@pytest.mark.parametrize("bits,symmetric,rotate", [(8, True, None), (4, True, None), (4, False, None),
                                                   (4, True, "hadamard")])
def test_quantized_linear_matches_numpy_and_stays_close_to_float(dev, bits, symmetric, rotate):
    import oar
    import oar.nn as nn
    from oar.quantization import QuantizedLinear, QuantScheme, dequantize_array, quantize_array

    oar.manual_seed(1)
    linear = nn.Linear(128, 48, bias=True).to(oar.device(dev))
    scheme = QuantScheme(bits=bits, group_size=32, symmetric=symmetric, rotate=rotate)
    q = QuantizedLinear.from_linear(linear, scheme)
    x = np.random.default_rng(1).standard_normal((3, 5, 128)).astype(np.float32)
    with oar.no_grad():
        got = q(oar.tensor(x, device=dev)).numpy()
    w, b = linear.weight.numpy(), linear.bias.numpy()
    rot = q.rotation.numpy() if rotate else np.eye(128, dtype=np.float32)
    deq = dequantize_array(*quantize_array(w @ rot, scheme), 32)
    np.testing.assert_allclose(got, (x @ rot) @ deq.T + b, rtol=1e-4, atol=1e-4)
    exact = x @ w.T + b
    rel = np.linalg.norm(got - exact) / np.linalg.norm(exact)
    assert rel < (0.01 if bits == 8 else 0.15), rel
    ratio = q.weight_bytes() / (w.size * 4)
    assert ratio == pytest.approx(((1 if bits == 8 else 0.5) + 4 / 32 * (1 if symmetric else 2)) / 4)


def test_hadamard_is_orthogonal_and_spreads_outliers():
    from oar.quantization import QuantScheme, dequantize_array, hadamard_rotation, quantize_array

    for k in (64, 384):
        r = hadamard_rotation(k, seed=3)
        np.testing.assert_allclose(r @ r.T, np.eye(k), atol=1e-5)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 256)).astype(np.float32)
    w[:, rng.choice(256, 4, replace=False)] *= 25.0  # outlier input features, as in trained LLMs
    plain, rotated = QuantScheme(bits=4, group_size=64), QuantScheme(bits=4, group_size=64, rotate="hadamard")
    r = hadamard_rotation(256, seed=0)
    err_plain = np.linalg.norm(dequantize_array(*quantize_array(w, plain), 64) - w)
    err_rot = np.linalg.norm(dequantize_array(*quantize_array(w @ r, rotated), 64) @ r.T - w)
    assert err_rot < 0.7 * err_plain, (err_rot, err_plain)


@pytest.fixture
def llama(dev):
    import oar
    from oar.models.llama import Llama, LlamaConfig

    return Llama(LlamaConfig(d_model=64, n_layers=2, n_heads=4, max_seq_len=32, seed=4, init_std=0.08)).to(
        oar.device(dev))


def test_quantize_weights_replaces_every_linear_and_generates(llama, dev):
    import oar
    import oar.nn as nn
    from oar.quantization import QuantizedLinear, quantize_weights

    tokens = oar.tensor(data.encode("for i in range(10):")[None, :], device=dev)
    with oar.no_grad():
        ref = llama(tokens).numpy()
    quantize_weights(llama, bits=8, group_size=32)
    assert not any(isinstance(m, nn.Linear) for _, m in llama.named_modules())
    assert sum(isinstance(m, QuantizedLinear) for _, m in llama.named_modules()) == 2 * 7
    with oar.no_grad():
        got = llama(tokens).numpy()
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 0.03  # 14 int8 layers, about 0.4% each
    new = llama.generate(data.encode("x = "), 6)
    assert new.shape == (6,)
    with pytest.raises(ValueError, match="already quantized"):
        quantize_weights(llama, bits=4)


def test_save_and_load_check_the_scheme(llama, dev, tmp_path):
    import oar
    from oar.models.llama import Llama
    from oar.quantization import QuantizationSchemeError, checkpoint, quantize_weights, restore

    quantize_weights(llama, bits=4, group_size=32, rotate="hadamard")
    path = tmp_path / "q.safetensors"
    oar.save(checkpoint(llama), path)
    fresh = quantize_weights(Llama(llama.cfg).to(oar.device(dev)), bits=4, group_size=32, rotate="hadamard")
    restore(fresh, oar.load(path, device=dev), str(path))
    tokens = oar.tensor(data.encode("while")[None, :], device=dev)
    with oar.no_grad():
        np.testing.assert_array_equal(fresh(tokens).numpy(), llama(tokens).numpy())
    other = quantize_weights(Llama(llama.cfg).to(oar.device(dev)), bits=4, group_size=32)
    with pytest.raises(QuantizationSchemeError, match="rotate.*hadamard.*quantize_weights"):
        restore(other, oar.load(path, device=dev), str(path))
    with pytest.raises(QuantizationSchemeError, match="None"):
        restore(Llama(llama.cfg).to(oar.device(dev)), oar.load(path, device=dev), str(path))


def test_bad_schemes_are_named():
    from oar.quantization import QuantScheme

    with pytest.raises(ValueError, match="bits"):
        QuantScheme(bits=3)
    with pytest.raises(ValueError, match="rotate"):
        QuantScheme(rotate="fft")
    with pytest.raises(ValueError, match="group_size"):
        QuantScheme(bits=4, group_size=7)


@pytest.mark.parametrize("bits,symmetric", [(8, True), (8, False), (4, True), (4, False)])
# leading dims of x: 1, 2 and 6 rows take the kernel's dot path (decode), 40 its BLAS path (prefill);
# group 256 spans two of the dot path's 128-byte tiles of codes at 8 bits
@pytest.mark.parametrize("lead", [(1, 1), (1, 2), (3, 2), (20, 2)])
@pytest.mark.parametrize("group", [64, 256])
def test_weight_only_linear_op_matches_numpy(dev, bits, symmetric, lead, group):
    import oar
    from oar.quantization import QuantScheme, dequantize_array, quantize_array
    from oar.quantization.weights import pack_int4

    rng = np.random.default_rng(bits * 10 + lead[0] * lead[1])
    w = rng.standard_normal((300, 512)).astype(np.float32)  # 300 rows: several blocks of 64, the last partial
    x = rng.standard_normal((*lead, 512)).astype(np.float32)
    codes, scales, zeros = quantize_array(w, QuantScheme(bits=bits, group_size=group, symmetric=symmetric))
    packed = codes if bits == 8 else pack_int4(codes)
    got = oar.weight_only_linear(*(oar.tensor(a, device=dev) for a in (x, packed, scales, zeros)),
                                 bits=bits, group_size=group).numpy()
    want = x @ dequantize_array(codes, scales, zeros, group).T
    assert got.shape == (*lead, 300)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-4)


def test_weight_only_linear_rejects_bad_inputs_by_name(dev):
    import oar

    x, scales = oar.zeros([2, 64], device=dev), oar.ones([8, 2], device=dev)
    codes = oar.zeros([8, 32], dtype="int8", device=dev)
    with pytest.raises(Exception, match="qweight.*int8"):
        oar.weight_only_linear(x, oar.zeros([8, 32], device=dev), scales, scales, bits=4, group_size=32)
    with pytest.raises(Exception, match=r"qweight must have shape \(8, 64\)"):
        oar.weight_only_linear(x, codes, scales, scales, bits=8, group_size=32)
    with pytest.raises(Exception, match="zeros' must have shape"):
        oar.weight_only_linear(x, codes, scales, oar.ones([8, 3], device=dev), bits=4, group_size=32)
    with pytest.raises(Exception, match="bits must be 4 or 8"):
        oar.weight_only_linear(x, codes, scales, scales, bits=3, group_size=32)


def test_quantized_linear_keeps_gradients_through_the_dequantized_path(dev):
    import oar
    import oar.nn as nn
    from oar.quantization import QuantizedLinear, QuantScheme

    q = QuantizedLinear.from_linear(nn.Linear(64, 8).to(oar.device(dev)), QuantScheme(bits=4, group_size=32))
    x = oar.tensor(np.random.default_rng(2).standard_normal((3, 64)).astype(np.float32), device=dev)
    with oar.no_grad():
        fast = q(x).numpy()
    x.requires_grad_(True)
    y = q(x)
    y.sum().backward()
    np.testing.assert_allclose(y.detach().numpy(), fast, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(x.grad.numpy(), np.broadcast_to(q.dequantized_weight().numpy().sum(0), (3, 64)),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bits,symmetric", [(8, True), (8, False), (4, True), (4, False)])
def test_dequantized_weight_is_one_fused_kernel_equal_to_numpy(dev, private_kernel_cache, bits, symmetric):
    import oar
    import oar.nn as nn
    from oar.quantization import QuantizedLinear, QuantScheme, dequantize_array, quantize_array

    oar.manual_seed(3)
    linear = nn.Linear(96, 40).to(oar.device(dev))
    scheme = QuantScheme(bits=bits, group_size=32, symmetric=symmetric)
    q = QuantizedLinear.from_linear(linear, scheme)
    want = dequantize_array(*quantize_array(linear.weight.numpy(), scheme), 32)
    np.testing.assert_allclose(q.dequantized_weight().numpy(), want, rtol=1e-6, atol=1e-7)
    explanation = oar.compile.explain(q.dequantized_weight)  # 4 bits: split the bytes, then scale
    assert len(explanation.kernels) == (1 if bits == 8 else 2) and not explanation.eager, str(explanation)
    compiled = oar.compile(q.dequantized_weight)
    for _ in range(2):  # trace, then replay
        np.testing.assert_allclose(compiled().numpy(), want, rtol=1e-6, atol=1e-7)



def test_quantized_linear_on_a_plugin_without_the_op_dequantizes_with_elementwise_ops(tmp_path):
    """The OpenCL plugin has no weight_only_linear kernel: QuantizedLinear dequantizes with elementwise
    ops and a matmul there instead of sending the whole op to the host, eager and compiled. (Two of
    those ops, floor_divide and remainder, are declared host fallbacks of this plugin.)"""
    run_on_opencl("""
        import oar.nn as nn
        from oar.quantization import QuantizedLinear, QuantScheme, dequantize_array, quantize_array

        dev = oar.get_device()
        assert oar.raw.kernel_query("weight_only_linear", ["float32", "int8", "float32", "float32", "float32"],
                                    dev, allow_missing=True) is None, "the plugin grew the op: test another way"
        oar.manual_seed(4)
        linear = nn.Linear(64, 24, bias=True).to(dev)
        scheme = QuantScheme(bits=4, group_size=32, symmetric=False)
        q = QuantizedLinear.from_linear(linear, scheme)
        xs = np.random.default_rng(4).standard_normal((5, 64)).astype(np.float32)
        want = xs @ dequantize_array(*quantize_array(linear.weight.numpy(), scheme), 32).T + linear.bias.numpy()
        oar.reset_fallback_stats()
        with oar.no_grad():
            eager = q(oar.tensor(xs)).numpy()
            compiled = oar.compile(q)
            runs = [compiled(oar.tensor(xs)).numpy() for _ in range(2)]
        assert "weight_only_linear" not in oar.fallback_stats(), oar.fallback_stats()
        assert set(oar.fallback_stats()) <= {"floor_divide", "remainder"}, oar.fallback_stats()
        for got in [eager, *runs]:
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
        print("OK")
    """, tmp_path)


def _plugin_blas():
    """The scipy-openblas32 library the CPU plugin links (one copy per process), through ctypes."""
    import ctypes
    import os

    scipy_openblas32 = pytest.importorskip("scipy_openblas32")
    return ctypes.CDLL(os.path.join(scipy_openblas32.get_lib_dir(), "libscipy_openblas.so"))


@pytest.mark.parametrize("op", ["weight_only_linear", "matmul_small", "matmul_large", "conv2d"])
def test_every_blas_user_sets_one_thread_per_call(dev, op):
    # OpenBLAS's thread count is process-wide: a count left raised (by a threaded gemm, or anyone)
    # must not leak into the next quantized or float32 BLAS call, and no call may leave it raised.
    import oar

    blas = _plugin_blas()
    rng = np.random.default_rng(0)
    oar.matmul(oar.ones([4, 4], device=dev), oar.ones([4, 4], device=dev)).numpy()  # the plugin's first BLAS use
    blas.scipy_openblas_set_num_threads(2)
    if op == "weight_only_linear":
        from oar.quantization import QuantScheme, dequantize_array, quantize_array
        from oar.quantization.weights import pack_int4

        w = rng.standard_normal((256, 512)).astype(np.float32)
        x = rng.standard_normal((40, 512)).astype(np.float32)  # 40 rows: the kernel's BLAS path
        codes, scales, zeros = quantize_array(w, QuantScheme(bits=4, group_size=64, symmetric=True))
        got = oar.weight_only_linear(*(oar.tensor(a, device=dev) for a in (x, pack_int4(codes), scales, zeros)),
                                     bits=4, group_size=64).numpy()
        want = x @ dequantize_array(codes, scales, zeros, 64).T
    elif op == "conv2d":
        x = rng.standard_normal((2, 8, 12, 12)).astype(np.float32)
        w = rng.standard_normal((16, 8, 3, 3)).astype(np.float32)
        got = oar.conv2d(oar.tensor(x, device=dev), oar.tensor(w, device=dev)).numpy()
        torch = pytest.importorskip("torch")
        want = torch.nn.functional.conv2d(torch.from_numpy(x), torch.from_numpy(w)).numpy()
    else:
        size = 64 if op == "matmul_small" else 512  # 512 in every dim: one BLAS call on all threads
        a, b = (rng.standard_normal((size, size)).astype(np.float32) for _ in range(2))
        got = oar.matmul(oar.tensor(a, device=dev), oar.tensor(b, device=dev)).numpy()
        want = a @ b
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3)
    assert blas.scipy_openblas_get_num_threads() == 1
