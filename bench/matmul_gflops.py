"""Matmul 1024^3 float32 on the plugin's library kernel, GFLOP/s, beside numpy's matmul."""

from __future__ import annotations

import numpy as np

import oar
from common import median_seconds, parse_args, report, select_device

N = 1024


def main() -> None:
    args = parse_args(__doc__)
    dev = select_device(args)
    rng = np.random.default_rng(0)
    a_host, b_host = rng.standard_normal((N, N), dtype=np.float32), rng.standard_normal((N, N), dtype=np.float32)
    c_host = np.empty((N, N), dtype=np.float32)
    a, b, c = (oar.raw.DeviceBuffer(N * N * 4) for _ in range(3))
    a.copy_from_host(a_host)
    b.copy_from_host(b_host)
    kernel = oar.raw.kernel_query("matmul", ["float32"] * 3)
    inputs, outputs = [a.desc([N, N]), b.desc([N, N])], [c.desc([N, N])]
    stream = oar.current_stream()

    def oar_matmul() -> None:
        oar.raw.kernel_launch(kernel, inputs, outputs, stream=stream)
        stream.synchronize()

    def numpy_matmul() -> None:
        np.matmul(a_host, b_host, out=c_host)

    oar_matmul(), numpy_matmul()  # warm-up
    flops = 2.0 * N ** 3
    ours = flops / median_seconds(oar_matmul, args.repeats) / 1e9
    peer = flops / median_seconds(numpy_matmul, args.repeats) / 1e9
    np.testing.assert_allclose(c.to_numpy("float32", (N, N)), c_host, rtol=1e-3, atol=1e-3)
    print(f"device {dev}, {N}x{N}x{N} float32, median of {args.repeats}")
    report("matmul", ours, "numpy", peer, "GFLOP/s", higher_is_better=True, target=0.9)


if __name__ == "__main__":
    main()
