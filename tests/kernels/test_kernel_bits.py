"""The fused kernels give the same bits wherever their buffers lie and on any number of
threads: each kernel on rows that start at every alignment mod 64 (`kernel_bits.py`), its
sums over rows between allocations that move the heap, and the same in processes with 2 and
3 intra-op threads. The bits must not follow a buffer's address: Eigen's reductions and its
scalar head and tail start where the address is aligned (common.h), which on an AVX2 build
turned one element of LayerNorm's dgamma 1 ULP in 2 runs of 3.

`BERT_TRAIN_KERNEL_MARCH=x86-64-v3` runs these on the AVX2 library of a CPU without AVX-512
(with a cache of its own: `BERT_TRAIN_KERNEL_CACHE`).
"""

import subprocess
import sys

import kernel_bits
import numpy as np
import pytest
from conftest import TESTS, require_fused_kernels
from robust_testing import subprocess_env


@pytest.fixture(autouse=True)
def _required(monkeypatch):
    require_fused_kernels(monkeypatch)


@pytest.fixture(scope="module")
def here():
    """`kernel_bits.full_outputs()` in this process (one intra-op thread under make test)."""
    return kernel_bits.full_outputs()


def test_every_kernel_gives_the_same_bits_at_every_buffer_alignment(here):
    assert kernel_bits.alignment_mismatches(here) == []
    assert len(here) == 18 and all(np.isfinite(v).all() for v in here.values())


def test_the_sums_over_rows_do_not_follow_the_heap(here):
    for name in ("layer_norm_dgamma", "layer_norm_dbeta"):
        repeats = here[name]
        assert repeats.shape == (kernel_bits.REPEATS, kernel_bits.WIDTH)
        for repeat in repeats[1:]:
            np.testing.assert_array_equal(repeat, repeats[0], err_msg=name)


@pytest.mark.parametrize("threads", [2, 3])
def test_the_same_bits_on_other_thread_counts_at_every_alignment(here, tmp_path, threads):
    path = tmp_path / "outputs.npz"
    done = subprocess.run([sys.executable, str(TESTS / "kernels" / "kernel_bits.py"), str(path)],
                          capture_output=True, text=True, timeout=300, check=False,
                          env=subprocess_env(TF_NUM_INTRAOP_THREADS=str(threads),
                                             BERT_TRAIN_FUSED_KERNELS="on"))
    assert done.returncode == 0, done.stderr[-3000:]
    there = np.load(path)
    assert list(there["mismatches"]) == []
    assert sorted(set(there.files) - {"mismatches"}) == sorted(here)
    for name, value in here.items():
        np.testing.assert_array_equal(there[name], value, err_msg=name)


def test_adamw_is_its_float32_formula_bit_for_bit():
    """Each element of the AdamW update rounds as its formula in float32 (numpy: one rounding
    per operation, IEEE sqrt), whichever of Eigen's vector loop or its scalar tail computes
    it and whatever the CPU's vector width: AVX-512's Eigen takes sqrt as an rsqrt estimate
    plus a Newton step, a last bit off in about 1 element in 2,000."""
    import tensorflow as tf  # noqa: PLC0415

    from bert_trainer import kernels  # noqa: PLC0415

    rng = np.random.default_rng(17)
    size = 5 * 1024 + 13  # whole chunks and a tail
    p0, m0, grad = (rng.standard_normal(size).astype(np.float32) for _ in range(3))
    v0 = np.abs(rng.standard_normal(size)).astype(np.float32)
    f = np.float32
    lr, b1p, b2p, b1, b2, eps, wd, scale = (f(1e-3), f(0.9), f(0.999), f(0.9), f(0.999),
                                            f(1e-6), f(0.01), f(0.5))
    variable, m, v = tf.Variable(p0), tf.Variable(m0), tf.Variable(v0)
    kernels.apply_adamw(variable, m, v, tf.constant(grad), lr=lr, beta1_power=b1p,
                        beta2_power=b2p, beta1=b1, beta2=b2, epsilon=eps, weight_decay=wd,
                        grad_scale=scale)
    g = grad * scale
    alpha = lr * np.sqrt(f(1) - b2p) / (f(1) - b1p)
    m1 = m0 + (g - m0) * (f(1) - b1)
    v1 = v0 + (g * g - v0) * (f(1) - b2)
    p1 = (p0 - p0 * wd * lr) - (m1 * alpha) / (np.sqrt(v1) + eps)
    for name, got, expected in (("m", m, m1), ("v", v, v1), ("variable", variable, p1)):
        assert expected.dtype == np.float32
        np.testing.assert_array_equal(got.numpy(), expected, err_msg=name)
