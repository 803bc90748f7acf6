"""The trainer asks the task for a step's FLOPs: counts by hand for the pretraining and
fine-tuning tasks, a task that cannot count, and a trainer that reads no model internals."""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO
from finetune_testing import make_task, shared_file
from summary_testing import read_scalars
from toy_task import ToyConfig, ToyTask

from bert_trainer import features as F
from bert_trainer import ops
from bert_trainer.encoders import build_encoder
from bert_trainer.tasks import plugins
from bert_trainer.tasks.base import Task
from bert_trainer.tasks.finetuning import FinetuningTask
from bert_trainer.tasks.masked_lm.task import PretrainingConfig, PretrainingTask
from bert_trainer.tasks.squad.task import SquadConfig
from bert_trainer.training.optimization import OptimizerConfig
from bert_trainer.training.trainer import Trainer, TrainerConfig

# Distinct sizes, so that a transposed operand cannot hide in the count.
LAYERS, HIDDEN, HEADS, INNER, VOCAB = 2, 24, 2, 40, 50
BATCH, SEQ, PREDICTIONS = 8, 10, 5


def mm(m, k, n):
    """FLOPs of an [m, k] x [k, n] product."""
    return 2 * m * k * n


def pretraining_batch():
    rng = np.random.default_rng(3)
    lengths = np.array([10, 10, 7, 4, 10, 6, 9, 10])  # 10 of 80 slots are padding, and more
    mask = (np.arange(SEQ)[None] < lengths[:, None]).astype(np.int32)
    positions = np.stack([rng.choice(np.arange(1, n), PREDICTIONS) for n in lengths])
    positions[3, -1] = 8  # a masked position past the real tokens: packed all the same
    weights = np.zeros((BATCH, PREDICTIONS), np.float32)
    weights[:, :2] = 1.0  # 16 weighted predictions of 40 ...
    weights[5, 3] = 1.0  # ... and one more: 17, computed as 32 rows
    batch = {F.INPUT_WORD_IDS: rng.integers(1, VOCAB, (BATCH, SEQ)).astype(np.int32) * mask,
             F.INPUT_MASK: mask, F.INPUT_TYPE_IDS: np.zeros_like(mask),
             F.MASKED_LM_POSITIONS: positions.astype(np.int32),
             F.MASKED_LM_IDS: rng.integers(1, VOCAB, (BATCH, PREDICTIONS)).astype(np.int32),
             F.MASKED_LM_WEIGHTS: weights,
             F.NEXT_SENTENCE_LABELS: rng.integers(0, 2, BATCH).astype(np.int32)}
    return {k: tf.constant(v) for k, v in batch.items()}


@pytest.mark.parametrize("shortcuts", [True, False], ids=["packed_rows", "every_slot"])
def test_pretraining_task_counts_what_its_pretrainer_executed(monkeypatch, shortcuts):
    monkeypatch.setattr(ops.switch, "_accelerators_visible", lambda: False)  # as on a CPU host
    task = PretrainingTask(
        PretrainingConfig(masking="static", seq_length=SEQ, max_predictions_per_seq=PREDICTIONS,
                          train_batch_size=BATCH, skip_unweighted_predictions=shortcuts,
                          pack_tokens=shortcuts),
        lambda: build_encoder("bert", vocab_size=VOCAB, hidden_size=HIDDEN, num_layers=LAYERS,
                              num_attention_heads=HEADS, inner_dim=INNER,
                              max_sequence_length=SEQ))
    model = task.build_model()
    batch = pretraining_batch()
    outputs = model(task.model_inputs(batch), training=True)
    counted = float(task.flops_counter(model)(batch, outputs))

    b, s, h, f, v, p = BATCH, SEQ, HIDDEN, INNER, VOCAB, PREDICTIONS
    mask = batch[F.INPUT_MASK].numpy() != 0
    if shortcuts:  # the real tokens, and [CLS] and the masked positions past them
        kept = mask.copy()
        kept[:, 0] = True
        np.put_along_axis(kept, batch[F.MASKED_LM_POSITIONS].numpy(), True, axis=1)
        tokens, rows = int(kept.sum()), 32
        assert tokens == mask.sum() + 1  # the position past the real tokens
    else:
        tokens, rows = b * s, b * p
    queries = b * (1 + p)  # the last layer's rows: [CLS] and the masked positions
    attention = 2 * mm(b * s, h, s)  # Q.K^T and probs.V, all heads together
    layer = 4 * mm(tokens, h, h) + mm(tokens, h, f) + mm(tokens, f, h) + attention
    last = (2 * mm(tokens, h, h) + 2 * mm(queries, h, h) + mm(queries, h, f) + mm(queries, f, h)
            + 2 * mm(queries, h, s))
    heads = mm(b, h, h) + mm(b, h, 2) + mm(rows, h, h) + mm(rows, h, v)  # pooler, NSP, MLM
    expected = 3 * ((LAYERS - 1) * layer + last + heads)
    assert counted == pytest.approx(expected, rel=1e-6)
    if shortcuts:
        assert model.packs_tokens() and F.MLM_ROWS in outputs


@pytest.mark.parametrize("name, options, head_outputs", [
    ("sst2", dict(train_file=shared_file("sst2/dev.tsv")), 2),  # classifier: 2 classes
    ("squad", dict(train_file=shared_file("squad/dev-v1.1-sample.json"), seq_length=64,
                   task_options={"squad": SquadConfig(max_query_length=24)}), 2),  # start, end
], ids=["classification", "question_answering"])
def test_finetuning_tasks_count_their_models_flops_without_family_code(tiny_pretrained, name,
                                                                       options, head_outputs):
    task = make_task(name, tiny_pretrained, **options)
    assert type(task).flops_counter is FinetuningTask.flops_counter  # no family override
    model = task.build_model()
    config = model.encoder.get_config()
    h, f, layers = config["hidden_size"], config["inner_dim"], config["num_layers"]
    b, s = 3, 12
    mask = (np.arange(s)[None] < np.array([[12], [5], [9]])).astype(np.int32)
    batch = {F.INPUT_WORD_IDS: tf.constant(mask * 7), F.INPUT_MASK: tf.constant(mask),
             F.INPUT_TYPE_IDS: tf.zeros((b, s), tf.int32)}
    with ops.portable():  # no packing (as in an export): every slot is computed
        outputs = model(task.model_inputs(batch), training=True)
        counted = float(task.flops_counter(model)(batch, outputs))
    with ops.fused_kernels(False):  # TensorFlow's ops pack the real tokens too: fewer FLOPs
        packed = float(task.flops_counter(model)(
            batch, model(task.model_inputs(batch), training=True)))
    assert 0 < packed < counted
    layer = 4 * mm(b * s, h, h) + mm(b * s, h, f) + mm(b * s, f, h) + 2 * mm(b * s, h, s)
    head = mm(b, h, head_outputs)  # a token-level head is counted once per sequence
    assert counted == pytest.approx(3 * (layers * layer + mm(b, h, h) + head), rel=1e-6)
    inputs = keras.Input((4,))  # a model without a bert-train encoder: unknown, not a guess
    assert task.flops_counter(keras.Model(inputs, keras.layers.Dense(2)(inputs))) is None


def test_every_task_family_inherits_the_fine_tuning_count():
    classes = {family.task_class for family in plugins.families()} - {None}
    assert len(classes) >= 4  # classification, regression, squad, tagging at least
    for cls in classes:
        for klass in cls.__mro__[:cls.__mro__.index(FinetuningTask)]:
            assert "flops_counter" not in vars(klass), klass


@pytest.mark.slow  # trains a few steps in this process
def test_a_task_that_cannot_count_flops_trains_without_flop_rates(tmp_path):
    task = ToyTask(ToyConfig())
    assert type(task).flops_counter is Task.flops_counter
    trainer = Trainer(task, str(tmp_path),
                      config=TrainerConfig(train_steps=4, steps_per_loop=2, summary_interval=2,
                                           eval_steps=0, peak_flops=1e12),
                      optimizer=OptimizerConfig(learning_rate=1e-2, warmup_steps=0))
    assert not trainer._step.counts_flops
    result = trainer.train_and_evaluate()
    assert result.step == 4 and np.isfinite(result.train["loss"])
    train = read_scalars(tmp_path / "train")
    assert set(train["examples_per_second"]) == {2, 4}
    assert set(train["tokens_per_second"]) == {2, 4}  # the rates it can count
    assert not {"mfu", "model_gflops_per_second", "peak_gflops"} & set(train)


def test_the_trainer_reads_no_model_internals():
    """The training step and its telemetry ask the task; what a model skips or packs, and its
    sizes, are the model's business."""
    training = REPO / "bert_trainer" / "training"
    internals = re.compile(r"MLM_ROWS|mlm_rows|packed_tokens|masked_lm|get_config|\.encoder\b")
    for name in ("train_step.py", "throughput.py", "trainer.py"):
        source = (training / name).read_text(encoding="utf-8")
        assert internals.findall(source) == [], name
