"""Telemetry arithmetic: the model FLOPs formula (`models.flops`), the interval rates and the
matmul peak."""

import dataclasses
import math
import sys

import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO

from bert_trainer import features as F
from bert_trainer import ops
from bert_trainer.encoders import build_encoder
from bert_trainer.models import flops
from bert_trainer.tasks.masked_lm.task import PretrainingConfig, PretrainingTask
from bert_trainer.training import throughput

sys.path.insert(0, str(REPO / "scripts"))
from bench import spec as spec_lib  # noqa: E402

# A tiny pretrainer whose sizes are all distinct, so a transposed operand cannot hide.
LAYERS, HIDDEN, HEADS, INNER, VOCAB, TYPES = 2, 24, 2, 40, 50, 3
BATCH, SEQ, PREDICTIONS = 2, 7, 3


def tiny_pretrainer():
    config = PretrainingConfig(masking="static", seq_length=SEQ,
                               max_predictions_per_seq=PREDICTIONS, train_batch_size=BATCH)
    task = PretrainingTask(config, lambda: build_encoder(
        "bert", vocab_size=VOCAB, hidden_size=HIDDEN, num_layers=LAYERS,
        num_attention_heads=HEADS, inner_dim=INNER, max_sequence_length=SEQ,
        type_vocab_size=TYPES))
    return task.build_model()


def test_formula_matches_a_matmul_by_matmul_hand_count():
    b, s, h, f, heads, p, v = BATCH, SEQ, HIDDEN, INNER, HEADS, PREDICTIONS, VOCAB
    d = h // heads
    # Every forward matmul as (m, k, n): 2*m*k*n FLOPs each.
    layer = [(b * s, h, h)] * 4 + [(b * s, h, f), (b * s, f, h)]
    layer += [(b * heads * s, d, s), (b * heads * s, s, d)]  # Q.K^T and probs.V
    heads_mm = [(b, h, h), (b, h, 2), (b * p, h, h), (b * p, h, v)]  # pooler, NSP, MLM x2
    forward = sum(2 * m * k * n for m, k, n in layer * LAYERS + heads_mm)
    per_example = flops.training_flops_per_example(
        num_layers=LAYERS, hidden_size=h, inner_dim=f, seq_length=s, vocab_size=v,
        num_predictions=p, head_params=h * 2)
    assert per_example * b == 3 * forward


def test_factorized_embeddings_add_the_projection_per_token_and_narrow_the_mlm():
    common = dict(num_layers=1, hidden_size=16, inner_dim=32, seq_length=5, vocab_size=100,
                  num_predictions=2)
    full = flops.training_flops_per_example(**common)
    factorized = flops.training_flops_per_example(embedding_width=4, **common)
    # + projection e*h on 5 tokens; MLM transform h->e and output e->V instead of h->h, h->V.
    delta = 5 * 2 * 4 * 16 + 2 * (2 * 16 * 4 + 2 * 4 * 100) - 2 * (2 * 16 * 16 + 2 * 16 * 100)
    assert factorized - full == 3 * delta


def test_the_benchmark_formula_agrees_with_the_trainers():
    step = spec_lib.StepSpec(spec_lib.SIZES["mini"])
    size = step.size
    per_example = flops.training_flops_per_example(
        num_layers=size.num_layers, hidden_size=size.hidden_size, inner_dim=size.inner_dim,
        seq_length=step.seq_length, vocab_size=size.vocab_size,
        num_predictions=step.max_predictions, head_params=size.hidden_size * 2)
    assert per_example * step.batch_size == spec_lib.train_flops(step)
    rows = 1 + step.max_predictions
    sparse = flops.training_flops_per_example(
        num_layers=size.num_layers, hidden_size=size.hidden_size, inner_dim=size.inner_dim,
        seq_length=step.seq_length, vocab_size=size.vocab_size,
        num_predictions=step.max_predictions, head_params=size.hidden_size * 2,
        last_layer_rows=rows)
    assert sparse * step.batch_size == spec_lib.train_flops(step, last_layer_rows=rows)
    # mini at seq 128, P 20: 107 of 128 rows skipped in the last of 4 layers.
    assert 1 - sparse / per_example == pytest.approx(0.13, abs=0.01)


def _matmul_flops(op, unknown=None) -> int:
    """2 * batch * m * k * n of a MatMul / BatchMatMulV2 op from its static shapes; an
    unknown dimension counts as `unknown`."""
    a, b = ([unknown if d is None else d for d in t.shape] for t in op.inputs[:2])
    if op.get_attr("transpose_a" if op.type == "MatMul" else "adj_x"):
        a[-2:] = a[-1:-3:-1]
    if op.get_attr("transpose_b" if op.type == "MatMul" else "adj_y"):
        b[-2:] = b[-1:-3:-1]
    assert a[-1] == b[-2], (op.name, a, b)
    batch = np.broadcast_shapes(tuple(a[:-2]), tuple(b[:-2]))
    return 2 * math.prod(batch) * a[-2] * a[-1] * b[-1]


def _traced_forward_flops(model, tokens=None):
    """The forward pass's matmul FLOPs, the type-embedding lookup left out; `tokens` stands
    for the packed row count, a dimension the trace leaves unknown."""
    specs = {k: tf.TensorSpec([BATCH, SEQ], tf.int32) for k in F.ENCODER_INPUTS}
    specs[F.MASKED_LM_POSITIONS] = tf.TensorSpec([BATCH, PREDICTIONS], tf.int32)
    graph = tf.function(lambda x: model(x, training=False)).get_concrete_function(specs).graph
    counted = {op.name: _matmul_flops(op, tokens) for op in graph.get_operations()
               if op.type in ("MatMul", "BatchMatMulV2")}
    # The type embedding is a one-hot matmul (a lookup in disguise): not model FLOPs.
    lookups = [n for n in counted if "type_embeddings" in n]
    assert len(lookups) == 1 and counted[lookups[0]] == 2 * BATCH * SEQ * TYPES * HIDDEN
    return sum(v for n, v in counted.items() if n not in lookups)


def test_model_flops_per_example_equals_the_matmuls_of_the_traced_forward_pass(monkeypatch):
    monkeypatch.setattr(ops.switch, "_accelerators_visible", lambda: False)  # as on a CPU host
    model = tiny_pretrainer()
    packed = model.execution
    model.execution = dataclasses.replace(packed, pack_tokens=False)
    assert model.flops_per_example(SEQ, PREDICTIONS) * BATCH == 3 * _traced_forward_flops(model)
    # Packed: the dense layers on the tokens computed (any count), attention still padded.
    model.execution = packed
    assert model.packs_tokens()
    for tokens in (9, BATCH * SEQ):
        assert model.flops_per_example(SEQ, PREDICTIONS, computed_tokens=tokens / BATCH) \
            * BATCH == pytest.approx(3 * _traced_forward_flops(model, tokens))


def test_rates_of_an_interval():
    counts = throughput.Counts(examples=64, tokens=6000, token_slots=8192, flops=4e12)
    values = throughput.rates(counts, seconds=2.0, peak_flops=1e13)
    assert values == pytest.approx({
        "examples_per_second": 32.0, "tokens_per_second": 3000.0,
        "padding_fraction": 1 - 6000 / 8192, "model_gflops_per_second": 2000.0, "mfu": 0.2})
    # Without a mask or a known model, only what was counted is reported.
    assert throughput.rates(throughput.Counts(examples=10), 5.0, 1e12) == {
        "examples_per_second": 2.0}


def test_peak_is_a_plausible_cpu_matmul_rate_and_bfloat16_is_measured_in_bfloat16(
        bfloat16_required):
    fp32 = throughput.measure_peak_flops("float32", "/device:CPU:0", size=256, seconds=0.05)
    # A 2-core CPU shared with others: between 0.1 and 10,000 GFLOP/s.
    assert 1e8 < fp32 < 1e13
    bf16 = throughput.measure_peak_flops("bfloat16", "/device:CPU:0", size=256, seconds=0.05)
    assert 1e7 < bf16 < 1e13
