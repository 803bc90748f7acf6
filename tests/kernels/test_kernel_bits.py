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
