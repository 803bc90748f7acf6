"""bert_trainer.kernels: the fused CPU kernels against TensorFlow's ops, where they are used,
and what a user sees when they cannot be built.

The kernels are required here (`BERT_TRAIN_FUSED_KERNELS=on`): a compiler that fails on the
source fails these tests. They skip, naming why, only where the run asked for TensorFlow's ops
or the machine has no compiler (conftest.fused_kernels_unavailable); the build's own tests
(`_without_the_library`) run everywhere.
"""

import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO, TESTS, require_fused_kernels
from export_testing import make_model_dir
from numerics import assert_close
from robust_testing import subprocess_env
from tensorflow.core.protobuf import saved_model_pb2

from bert_trainer import kernels, losses, ops
from bert_trainer.export.exporter import build_serving_module, save
from bert_trainer.kernels import build
from bert_trainer.layers import Dropout, LayerNormalization, TransformerEncoder, gelu

RNG = np.random.default_rng(0)
FUSED_OPS = {"BertFusedDropout", "BertAttentionSoftmax", "BertAttentionSoftmaxGrad",
             "BertLayerNorm", "BertLayerNormGrad", "BertGelu", "BertGeluGrad", "BertSplitHeads",
             "BertMergeHeads", "BertSplitHeadsPacked", "BertMergeHeadsPacked", "BertPackRows",
             "BertUnpackRows", "BertSparseSoftmaxXent", "BertSparseSoftmaxXentGrad",
             "BertApplyAdamW"}


def _without_the_library(test):
    """Marks a test of the build itself: it runs without the library (and a compiler)."""
    test.without_the_library = True
    return test


@pytest.fixture(autouse=True)
def _required(request, monkeypatch):
    if getattr(request.function, "without_the_library", False):
        return
    # The kernels run on the CPU wherever they are asked to; `auto` skips them when a GPU is
    # visible (tested below), which would leave these tests checking TensorFlow's ops.
    require_fused_kernels(monkeypatch)


def _graph_op_types(graph_def) -> set:
    """Op types of a GraphDef's nodes and of every function in its library."""
    types = {node.op for node in graph_def.node}
    for function in graph_def.library.function:
        types |= {node.op for node in function.node_def}
    return types


def _traced_op_types(fn, *args, jit_compile=False) -> set:
    concrete = tf.function(fn, jit_compile=jit_compile).get_concrete_function(*args)
    return _graph_op_types(concrete.graph.as_graph_def())


def _encoder_step(layer, data):
    """Forward and backward of `layer` in training: (output, gradients)."""

    def step(x):
        with tf.GradientTape() as tape:
            out = layer(x, training=True)
            loss = tf.reduce_sum(out * out)
        return out, tape.gradient(loss, layer.trainable_variables)

    return step


# ----------------------------------------------------------------------------------- dropout


def test_dropout_keeps_one_minus_rate_scales_exactly_and_repeats_its_seed():
    x = tf.ones([16, 4, 128, 129])  # 1.06 M elements, an odd row length
    y = kernels.dropout(x, 0.1, [3, 4]).numpy()
    assert set(np.unique(y)) == {0.0, np.float32(1.0 / 0.9)}
    dropped = y == 0
    assert abs(dropped.mean() - 0.1) < 0.002  # binomial standard deviation 0.0003
    np.testing.assert_array_equal(kernels.dropout(x, 0.1, [3, 4]).numpy(), y)
    # Another seed: an independent mask (both drop with probability 0.1 * 0.1).
    other = kernels.dropout(x, 0.1, [3, 5]).numpy() == 0
    assert abs((dropped & other).mean() - 0.01) < 0.001
    # No structure along the element index: neighbours are independent too.
    flat = dropped.reshape(-1)
    assert abs((flat[1:] & flat[:-1]).mean() - 0.01) < 0.001


def test_dropout_gradient_is_the_same_mask_in_every_dtype():
    x = tf.random.normal([8, 33, 17], seed=1)
    seed = tf.constant([7, 9])
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = kernels.dropout(x, 0.25, seed)
    grad = tape.gradient(y, x).numpy()
    assert_close(grad, np.where(y.numpy() != 0, 1.0 / 0.75, 0.0))
    assert 0.2 < (grad == 0).mean() < 0.3
    for dtype in (tf.bfloat16, tf.float16):
        half = kernels.dropout(tf.cast(x, dtype), 0.25, seed)
        assert half.dtype == dtype
        np.testing.assert_array_equal(half.numpy() == 0, y.numpy() == 0)


def test_dropout_layer_uses_the_kernel_in_training_only():
    layer = Dropout(0.1, seed=5)
    x = tf.ones([4, 64])
    assert "BertFusedDropout" in _traced_op_types(lambda v: layer(v, training=True), x)
    assert not FUSED_OPS & _traced_op_types(lambda v: layer(v, training=False), x)
    first, second = layer(x, training=True), layer(x, training=True)
    assert not np.array_equal(first, second)  # the seed generator advances
    assert abs(float(tf.reduce_mean(first)) - 1.0) < 0.2


def test_dropout_layer_uses_the_kernel_for_rates_16_bits_cannot_hold():
    layer = Dropout(0.005, seed=5)
    assert "BertFusedDropout" in _traced_op_types(lambda v: layer(v, training=True),
                                                  tf.ones([4, 64]))
    dropped = (layer(tf.ones([256, 1024]), training=True).numpy() == 0).mean()
    assert abs(dropped - 0.005) < 0.001  # 262 k draws: standard deviation 0.00014


def test_dropout_rejects_a_bad_rate_and_seed():
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"rate must be in \[0, 1\), got 1"):
        kernels.dropout(tf.ones([3]), 1.0, [1, 2])
    with pytest.raises(tf.errors.InvalidArgumentError, match="seed must have 2 elements"):
        kernels.library().bert_fused_dropout(tf.ones([3]), tf.constant([1, 2, 3], tf.int64),
                                             rate=0.1)


# ------------------------------------------------------------ LayerNorm, GELU, cross-entropy


@pytest.mark.parametrize("shape", [(3, 7, 256), (3, 7, 1000), (2, 64)],
                         ids=["21_rows", "width_1000", "2_rows"])
def test_layer_norm_matches_the_formula_and_its_gradient(shape):
    width = shape[-1]
    x = tf.constant(RNG.standard_normal(shape).astype("float32") * 3.0 + 1.0)
    gamma = tf.constant(RNG.normal(1.0, 0.3, width).astype("float32"))
    beta = tf.constant(RNG.normal(0.0, 0.3, width).astype("float32"))
    upstream = tf.constant(RNG.standard_normal(x.shape).astype("float32"))

    def reference(x, gamma, beta):
        mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
        return (x - mean) * tf.math.rsqrt(var + 1e-12) * gamma + beta

    results = []
    for fn in (lambda *a: kernels.layer_norm(*a, 1e-12), reference):
        with tf.GradientTape() as tape:
            tape.watch([x, gamma, beta])
            y = fn(x, gamma, beta)
            loss = tf.reduce_sum(y * upstream)
        results.append([y, *tape.gradient(loss, [x, gamma, beta])])
    for got, want in zip(*results, strict=True):
        np.testing.assert_allclose(got, want, atol=2e-4, rtol=1e-4)


def test_layer_norm_of_zero_width_is_empty_and_differentiable():
    x, empty = tf.zeros([3, 0]), tf.zeros([0])
    y, mean, rstd = kernels.library().bert_layer_norm(x, empty, empty, epsilon=1e-12)
    assert y.shape == (3, 0) and mean.shape == rstd.shape == (3,)
    assert np.all(np.isnan(mean)) and np.all(np.isnan(rstd))  # the moments of nothing
    dx, dgamma, dbeta = kernels.library().bert_layer_norm_grad(x, x, empty, mean, rstd)
    assert dx.shape == (3, 0) and dgamma.shape == dbeta.shape == (0,)


def test_gelu_matches_tensorflows_exact_gelu_in_every_dtype():
    x = tf.constant(np.linspace(-8.0, 8.0, 4001, dtype="float32"))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(x)
        ours, want = kernels.gelu(x), tf.nn.gelu(x, approximate=False)
    np.testing.assert_allclose(ours, want, atol=1e-6)
    np.testing.assert_allclose(tape.gradient(ours, x), tape.gradient(want, x), atol=1e-6)
    for dtype, mantissa_bits in ((tf.bfloat16, 8), (tf.float16, 11)):
        low = tf.cast(x, dtype)
        out = kernels.gelu(low)
        assert out.dtype == dtype  # computed in float32, rounded once: within one rounding
        want = tf.nn.gelu(tf.cast(low, tf.float32), approximate=False)
        np.testing.assert_allclose(out.numpy().astype("float32"), want,
                                   rtol=2.0 ** -mantissa_bits, atol=1e-6)
        with tf.GradientTape() as tape:  # the gradient too: float32 math, rounded once
            tape.watch(low)
            grad = tape.gradient(kernels.gelu(low), low)
        low32 = tf.cast(low, tf.float32)
        with tf.GradientTape() as tape:
            tape.watch(low32)
            want_grad = tape.gradient(tf.nn.gelu(low32, approximate=False), low32)
        assert grad.dtype == dtype
        np.testing.assert_allclose(grad.numpy().astype("float32"), want_grad,
                                   rtol=2.0 ** -mantissa_bits, atol=1e-6)


def test_cross_entropy_gradient_and_hits_at_vocabulary_size():
    logits = tf.constant(RNG.standard_normal((12, 30522)).astype("float32") * 4.0)
    labels = tf.constant(RNG.integers(0, 30522, 12).astype("int64"))
    labels = tf.tensor_scatter_nd_update(labels, [[0]], tf.argmax(logits[:1], -1))  # a hit
    upstream = tf.constant(RNG.random(12).astype("float32"))
    with tf.GradientTape(persistent=True) as tape:
        tape.watch(logits)
        ours, hits = kernels.sparse_softmax_cross_entropy(labels, logits)
        want = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
        ours_sum, want_sum = tf.reduce_sum(ours * upstream), tf.reduce_sum(want * upstream)
    np.testing.assert_allclose(ours, want, rtol=1e-5)
    np.testing.assert_allclose(tape.gradient(ours_sum, logits), tape.gradient(want_sum, logits),
                               rtol=1e-5, atol=1e-8)
    np.testing.assert_array_equal(hits, tf.cast(tf.argmax(logits, -1) == labels, tf.float32))
    assert hits[0] == 1.0


def test_cross_entropy_names_a_label_out_of_range():
    logits = tf.zeros([3, 50])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"label 50 at row 1 is outside the valid range \[0, 50\)"):
        kernels.sparse_softmax_cross_entropy(tf.constant([0, 50, 2]), logits)


@pytest.mark.parametrize("dtype", [tf.float32, tf.bfloat16])
def test_split_and_merge_heads_are_the_reshape_transpose_and_split(dtype):
    batch, seq, heads, dim = 2, 5, 4, 6
    x = tf.cast(tf.random.normal([batch, seq, 3 * heads * dim], seed=2), dtype)
    with tf.GradientTape() as tape:
        tape.watch(x)
        q, k, v = kernels.split_heads(x, 3, heads)
        loss = tf.reduce_sum(tf.cast(q, tf.float32)) + 2.0 * tf.reduce_sum(tf.cast(v, tf.float32))
    want = tf.split(tf.transpose(tf.reshape(x, [batch, seq, 3 * heads, dim]), [0, 2, 1, 3]), 3,
                    axis=1)
    for got, expected in zip((q, k, v), want, strict=True):
        assert got.shape == (batch, heads, seq, dim) and got.dtype == dtype
        # Data movement only: bit for bit.
        np.testing.assert_array_equal(tf.cast(got, tf.float32), tf.cast(expected, tf.float32))
    # The gradient is the merge of (1, 0, 2): the three thirds of each row.
    grad = tf.reshape(tf.cast(tape.gradient(loss, x), tf.float32), [batch, seq, 3, -1]).numpy()
    assert [set(np.unique(grad[:, :, i])) for i in range(3)] == [{1.0}, {0.0}, {2.0}]
    np.testing.assert_array_equal(tf.cast(kernels.merge_heads([q, k, v]), tf.float32),
                                  tf.cast(x, tf.float32))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"x must be \[batch, seq, 3 \* 5"):
        kernels.library().bert_split_heads(tf.ones([2, 3, 16]), N=3, num_heads=5)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"inputs must be \[batch, 5, seq"):
        kernels.library().bert_merge_heads([tf.ones([2, 4, 3, 6])], num_heads=5)


def test_the_kernels_give_the_same_bits_on_any_number_of_threads(tmp_path):
    """Each kernel splits its work over the op's intra-op threads (`ParallelFor`), into as
    many pieces as the pool's size and the work's cost say; no split may change a bit. This
    process (one intra-op thread under `make test`: tests/conftest.py) against one with four,
    on inputs large enough to be split there: every kernel, forward and backward."""
    from kernel_threads import results  # noqa: PLC0415

    path = tmp_path / "four_threads.npz"
    done = subprocess.run([sys.executable, str(TESTS / "kernel_threads.py"), str(path)],
                          capture_output=True, text=True, timeout=300, check=False,
                          env=subprocess_env(TF_NUM_INTRAOP_THREADS="4",
                                             BERT_TRAIN_FUSED_KERNELS="on"))
    assert done.returncode == 0, done.stderr[-3000:]
    here, four = results(), np.load(path)
    assert sorted(four.files) == sorted(here) and len(here) == 21
    for name, value in here.items():
        assert value.size >= 128 and np.isfinite(value).all(), name
        np.testing.assert_array_equal(four[name], value, err_msg=name)


# ------------------------------------------------------------------------- where they run


def test_a_training_step_of_the_encoder_runs_on_the_kernels():
    layer = TransformerEncoder(num_attention_heads=2, inner_dim=32, output_dropout=0.1,
                               attention_dropout=0.1)
    data = tf.constant(RNG.standard_normal((2, 6, 16)).astype("float32"))
    layer(data)
    types = _traced_op_types(_encoder_step(layer, data), data)
    assert {"BertFusedDropout", "BertLayerNorm", "BertLayerNormGrad", "BertGelu",
            "BertGeluGrad", "BertSplitHeads", "BertMergeHeads"} <= types

    # ... and the pretraining loss with its accuracy is one cross-entropy op.
    logits = tf.zeros([2, 3, 40])
    labels = tf.zeros([2, 3], tf.int32)

    def loss_and_hits(logits):
        return losses.sparse_softmax_cross_entropy(labels, logits), losses.label_is_top(
            labels, logits)

    assert "BertSparseSoftmaxXent" in _traced_op_types(loss_and_hits, logits)


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_tensorflow_ops_under_xla_inside_disabled_and_when_off(monkeypatch):
    layer = TransformerEncoder(num_attention_heads=2, inner_dim=32, output_dropout=0.1)
    data = tf.constant(RNG.standard_normal((2, 6, 16)).astype("float32"))
    layer(data)
    step = _encoder_step(layer, data)
    out, grads = tf.function(step, jit_compile=True)(data)  # XLA compiles it: no custom op
    assert out.shape == (2, 6, 16) and all(np.all(np.isfinite(g)) for g in grads)
    assert not FUSED_OPS & _traced_op_types(step, data, jit_compile=True)
    with ops.fused_kernels(False):
        assert not ops.fused()
        assert not FUSED_OPS & _traced_op_types(step, data)
    assert ops.fused()
    assert not ops.fused(tf.float64)  # the elementwise kernels take 16- and 32-bit floats
    assert LayerNormalization(dtype="float64")(tf.ones([2, 4], tf.float64)).dtype == tf.float64
    assert gelu(tf.ones([3], tf.float64)).dtype == tf.float64
    monkeypatch.setenv(ops.MODE_ENV, "off")
    assert not ops.fused()
    assert not FUSED_OPS & _traced_op_types(step, data)
    monkeypatch.setenv(ops.MODE_ENV, "fast")
    with pytest.raises(ValueError, match="BERT_TRAIN_FUSED_KERNELS='fast': expected one of auto"):
        ops.fused()


@pytest.mark.slow  # trains end to end in this process: left out of make test-fast
@pytest.mark.parametrize("jit_compile", [False, True], ids=["tensorflow", "xla"])
def test_the_trainers_pretraining_step_runs_with_the_kernels_required(jit_compile):
    """The real trainer and pretraining task (as the benchmark builds them): on TensorFlow
    the step runs the kernels, and its XLA step, traced inside the compiled function, leaves
    them out instead of failing to compile."""
    sys.path.insert(0, str(REPO / "scripts"))
    from bench import bert_train_step, spec  # noqa: PLC0415

    step = spec.StepSpec(spec.SIZES["nano"], batch_size=4, seq_length=16, max_predictions=3,
                         jit_compile=jit_compile)
    _, run = bert_train_step.build(step)
    losses = [run(2)["loss"] for _ in range(2)]
    assert all(np.isfinite(loss) and loss > 0 for loss in losses)


def test_a_visible_accelerator_leaves_the_kernels_off(monkeypatch):
    monkeypatch.setenv(ops.MODE_ENV, "auto")
    assert ops.fused()
    monkeypatch.setattr(ops.switch, "_accelerators_visible", lambda: True)
    assert not ops.fused()
    layer = Dropout(0.1, seed=1)
    assert not FUSED_OPS & _traced_op_types(lambda v: layer(v, training=True), tf.ones([2, 8]))


@pytest.mark.slow  # trains end to end in this process: left out of make test-fast
def test_exported_saved_model_holds_only_tensorflow_ops(tmp_path):
    path, model = make_model_dir(tmp_path / "cls", "classification", pair=True, seq_length=16)
    assert ops.fused()  # so the export below had them available, and left them out
    output = save(build_serving_module(str(path)), str(tmp_path / "export"))
    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((pathlib.Path(output) / "saved_model.pb").read_bytes())
    types = set().union(*(_graph_op_types(meta.graph_def) for meta in saved.meta_graphs))
    assert {"MatMul", "Softmax"} & types  # the model is in there
    assert not {t for t in types if t.startswith("Bert")}


# ----------------------------------------------------------------------------------- build


def test_the_cache_is_the_users_alone_and_its_library_matches_its_record():
    kernels.library()
    library = build.cached().path
    assert library.stat().st_mode & 0o777 == 0o500  # no one writes it in place
    assert library.parent.stat().st_mode & 0o777 == 0o700
    assert build.cache.untrusted(library) is None  # its bytes are those the build recorded


@_without_the_library
@pytest.mark.parametrize("edited", ["attention.cc", "common.h"])
def test_the_cache_key_follows_every_source_and_header_and_the_cache_dir(tmp_path, monkeypatch,
                                                                         edited):
    monkeypatch.setenv(build.CACHE_ENV, str(tmp_path / "cache"))
    first = build.library_path()
    assert first.parent == tmp_path / "cache" and first.name.startswith("bert_kernels_")
    copy = tmp_path / "kernels"
    copy.mkdir()
    for path in build.sources() + build.headers():
        (copy / path.name).write_bytes(path.read_bytes())
    monkeypatch.setattr(build, "KERNEL_DIR", copy)
    assert build.library_path() == first  # the same files: the same library
    (copy / edited).write_text((copy / edited).read_text() + "\n// edited\n")
    assert build.library_path() != first
    # ... and needs no compiler: a library built ahead of time loads without one.
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    assert build.library_path().parent == tmp_path / "cache"


@pytest.mark.slow  # compiles an edited source (-fsyntax-only, ~10 s)
def test_the_sources_compile_without_a_warning(tmp_path):
    """-Wall -Wextra on our sources, TensorFlow's headers as system headers: a warning in
    our code is a bug. A build records what its compilers printed beside the library
    (`build.warnings_path`; the cache key covers every source), so the library these tests
    run is checked without compiling it again."""
    try:
        build.compiler()
    except build.BuildError as e:
        pytest.skip(str(e))
    command = build.compile_command(build.sources()[0], tmp_path / "x.o")
    assert {"-Wall", "-Wextra"} <= set(command) and "-w" not in command
    recorded = build.warnings_path(build.build().path)
    messages = (recorded.read_text() if recorded.exists()  # else built before it was kept
                else build.compile_library(tmp_path / "kernels.so"))
    assert messages == ""
    # The check can fail: an unused variable in a copy of a source is reported.
    edited = tmp_path / "packing.cc"
    source = build.KERNEL_DIR / "packing.cc"
    edited.write_text(source.read_text().replace(
        "  const Tensor& x = ctx->input(0);", "  int unused_here = 0;\n  const Tensor& x = "
        "ctx->input(0);", 1))
    command = [*build.compile_command(edited, tmp_path / "p.o"), "-I", str(build.KERNEL_DIR)]
    command[command.index("-c")] = "-fsyntax-only"
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    messages = done.stdout + done.stderr
    assert "packing.cc" in messages and "unused_here" in messages and "-Wunused" in messages


def _run_python(code: str, **env) -> subprocess.CompletedProcess:
    environ = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3", **env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=environ, timeout=300, check=False, cwd=REPO)


@pytest.mark.slow  # trains end to end in this process: left out of make test-fast
@_without_the_library
def test_without_a_compiler_auto_falls_back_and_on_fails_with_the_fix(tmp_path):
    no_compiler = {"CXX": "", "PATH": str(tmp_path), build.CACHE_ENV: str(tmp_path / "c")}
    code = ("from bert_trainer import losses, ops\nimport tensorflow as tf\n"
            "print('active', ops.fused())\n"
            "print(float(losses.sparse_softmax_cross_entropy(tf.constant([1]), "
            "tf.constant([[0.0, 0.0]]))[0]))")
    auto = _run_python(code, BERT_TRAIN_FUSED_KERNELS="auto", **no_compiler)
    assert auto.returncode == 0, auto.stderr
    printed = auto.stdout.split()
    assert printed[:2] == ["active", "False"]
    assert abs(float(printed[2]) - np.log(2.0)) < 1e-6  # TensorFlow's ops did the work
    assert "Fused CPU kernels unavailable, using TensorFlow's ops: no C++ compiler found" in (
        auto.stderr)
    required = _run_python("import sys\nfrom bert_trainer.kernels import build\n"
                           "sys.exit(build.main())", BERT_TRAIN_FUSED_KERNELS="on",
                           **no_compiler)
    assert required.returncode == 1
    assert required.stderr.strip().splitlines()[-1] == (
        "bert-train fused CPU kernels: no C++ compiler found (tried $CXX, g++, c++): install "
        "g++, or set BERT_TRAIN_FUSED_KERNELS=off to use TensorFlow's own ops")


@pytest.mark.slow  # trains end to end in this process: left out of make test-fast
@_without_the_library
def test_a_failing_compile_leaves_its_log_and_no_library(tmp_path):
    cache = tmp_path / "cache"
    done = _run_python("import sys\nfrom bert_trainer import ops\n"
                       "try:\n    ops.fused()\nexcept RuntimeError as e:\n"
                       "    print(e)\n    sys.exit(3)",
                       BERT_TRAIN_FUSED_KERNELS="on", CXX="false",
                       **{build.CACHE_ENV: str(cache), build.MARCH_ENV: ""})
    assert done.returncode == 3, done.stderr
    assert re.search(r"BERT_TRAIN_FUSED_KERNELS=on but the fused CPU kernels are unavailable: "
                     r"compiling \w+\.cc for -march=native failed: .* \(the compiler's output is "
                     r"in ", done.stdout)
    assert len(list(cache.glob("*.log"))) == 1
    assert not list(cache.glob("*.so"))  # nothing half-written is left to load
