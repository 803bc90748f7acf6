"""SentenceClassificationTask: warm start, losses, host metrics, and learning from a checkpoint."""

import numpy as np
import pytest
import tensorflow as tf
from finetune_testing import (
    assert_encoder_equals,
    make_task,
    scalar_history,
    shared_file,
    train,
    write_tiny_hf,
)

from bert_trainer import features as F
from bert_trainer.errors import UserError
from bert_trainer.features import LOGITS
from bert_trainer.tasks import finetuning, plugins, rebuild, registry
from bert_trainer.tasks.classification.task import PREDICTIONS
from bert_trainer.training import optimization

POSITIVE = ["good", "great", "best", "fine", "nice", "love", "fun", "beautiful"]
NEGATIVE = ["bad", "worst", "dull", "poor", "boring", "awful", "ugly", "mess"]
FILLER = ["the", "movie", "was", "a", "plot", "film", "story", "and"]


def separable_tsv(path, num: int, seed: int) -> str:
    """Five positive or five negative words and a filler word: label 1 for positive ones.

    Every word but one carries the label, so a randomly initialized one-layer encoder, whose
    [CLS] attends almost uniformly at first, learns it within a few dozen steps.
    """
    rng = np.random.default_rng(seed)
    lines = ["text\tlabel"]
    for _ in range(num):
        label = int(rng.integers(2))
        words = [*rng.choice(POSITIVE if label else NEGATIVE, size=5), rng.choice(FILLER)]
        rng.shuffle(words)
        lines.append(f"{' '.join(words)}\t{label}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def test_warm_start_loads_the_encoder_and_leaves_the_head(tiny_pretrained):
    task = make_task("sst2", tiny_pretrained, train_file=shared_file("sst2/dev.tsv"))
    model = task.build_model()
    head_before = [v.numpy().copy() for v in model.classifier.weights]
    task.initialize(model, tiny_pretrained["prefix"])
    assert_encoder_equals(model.encoder, tiny_pretrained["encoder_weights"])
    for variable, before in zip(model.classifier.weights, head_before, strict=True):
        np.testing.assert_array_equal(variable.numpy(), before)
    report = task.warm_start_report
    assert len(report["loaded"]) == len(model.encoder.weights)
    assert sorted(report["initialized"]) == sorted(v.path for v in model.classifier.weights)


def test_warm_start_from_a_hugging_face_directory(tiny_pretrained, tmp_path):
    """An HF directory (written from the tiny encoder) warm-starts the same encoder weights."""
    hf_dir = write_tiny_hf(tiny_pretrained, tmp_path / "hf")
    spec = finetuning.spec_from_checkpoint(hf_dir)
    assert spec.vocab_size == tiny_pretrained["vocab_size"] and spec.max_sequence_length == 64
    task = registry.build_task(registry.resolve_task_data("sst2"), spec,
                               config=finetuning.FinetuneConfig(seq_length=32))
    model = task.build_model()
    task.initialize(model, hf_dir)
    assert_encoder_equals(model.encoder, tiny_pretrained["encoder_weights"])


def test_losses_are_per_example_cross_entropy_and_squared_error(tiny_pretrained, tmp_path):
    task = make_task("sst2", tiny_pretrained, train_file=shared_file("sst2/dev.tsv"))
    logits = np.array([[2.0, -1.0], [0.5, 0.5], [-3.0, 1.0]], np.float32)
    labels = np.array([0, 1, 1], np.int32)
    loss = task.build_losses({F.LABEL_IDS: labels}, {LOGITS: tf.constant(logits)})["loss"]
    log_softmax = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(loss.numpy(), -log_softmax[np.arange(3), labels], rtol=1e-5)

    tsv = tmp_path / "scores.tsv"
    tsv.write_text("text\tlabel\na\t1.5\nb\t0.0\n", encoding="utf-8")
    regression = make_task("regression", tiny_pretrained, train_file=str(tsv))
    assert regression.family == "regression" and regression.num_classes == 1
    loss = regression.build_losses({F.LABEL_IDS: np.array([1.5, 0.0], np.float32)},
                                   {LOGITS: tf.constant([[1.0], [-2.0]])})["loss"]
    np.testing.assert_allclose(loss.numpy(), [0.25, 4.0])


def test_host_metrics_per_glue_task(tiny_pretrained):
    """MRPC scores accuracy and F1 of class 1; CoLA the Matthews correlation (hand-computed)."""
    mrpc = make_task("mrpc", tiny_pretrained, train_file=shared_file("mrpc/dev.tsv"))
    assert mrpc.metric_names == ("accuracy", "f1") and mrpc.best_metric == "f1"
    gathered = {F.LABEL_IDS: np.array([1, 0, 1, 1, 0]), PREDICTIONS: np.array([1, 0, 0, 1, 1])}
    results = mrpc.aggregate_eval(gathered)
    # tp=2, fp=1, fn=1: precision = recall = 2/3.
    assert results == pytest.approx({"accuracy": 0.6, "f1": 2 / 3, "num_examples": 5})
    cola = registry.build_task(
        registry.resolve_task_data("cola"), mrpc.encoder_spec, config=mrpc.config)
    assert cola.best_metric == "matthews_corrcoef"
    # tp=2, tn=1, fp=1, fn=1: (2*1 - 1*1) / sqrt(3*3*2*2) = 1/6.
    assert cola.aggregate_eval(gathered)["matthews_corrcoef"] == pytest.approx(1 / 6)


def test_sequence_length_and_vocab_must_fit_the_encoder(tiny_pretrained, tmp_path):
    with pytest.raises(UserError, match=r"seq_length=128 exceeds the encoder's "
                                        r"max_sequence_length=64 \(--init_checkpoint="):
        make_task("sst2", tiny_pretrained, train_file=shared_file("sst2/dev.tsv"),
                  seq_length=128)
    small = tmp_path / "vocab.txt"
    small.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\n", encoding="utf-8")
    with pytest.raises(UserError, match=rf"vocab file .*vocab.txt has 6 tokens but the encoder "
                                        rf".* has vocab_size={tiny_pretrained['vocab_size']}"):
        spec = finetuning.spec_from_checkpoint(tiny_pretrained["dir"], vocab_file=str(small))
        registry.build_task(registry.resolve_task_data("sst2"), spec,
                            config=finetuning.FinetuneConfig(seq_length=32))


@pytest.mark.slow  # over a few seconds: left out of make test-fast
def test_learns_a_separable_task_from_the_checkpoint(tiny_pretrained, tmp_path):
    train_file = separable_tsv(tmp_path / "train.tsv", 480, seed=0)
    eval_file = separable_tsv(tmp_path / "dev.tsv", 100, seed=1)
    task = make_task("classification", tiny_pretrained, train_file=train_file,
                     eval_file=eval_file, seq_length=16)
    assert task.task_data.label_names == ("0", "1") and task.num_examples("train") == 480
    _, result = train(task, str(tmp_path / "run"), tiny_pretrained["dir"], steps=60,
                      learning_rate=2e-3, summary_interval=10)
    losses = scalar_history(str(tmp_path / "run"), "loss")
    assert len(losses) == 6 and all(np.isfinite(losses))
    assert losses[-1] < 0.5 * losses[0], losses
    assert result.eval["accuracy"] > 0.9, result.eval
    assert result.eval["num_examples"] == 100
    assert scalar_history(str(tmp_path / "run"), "accuracy")[-1] > 0.8  # training accuracy


@pytest.mark.slow  # trains end to end in this process: left out of make test-fast
def test_mrpc_pairs_and_regression_train_and_evaluate(tiny_pretrained, tmp_path):
    """Real MRPC pairs (GLUE's TSV preset) and a handmade STS-B-like regression file."""
    mrpc = make_task("mrpc", tiny_pretrained, train_file=shared_file("mrpc/train.tsv"),
                     eval_file=shared_file("mrpc/dev.tsv"), max_train_examples=64,
                     max_eval_examples=40, seq_length=64)
    _, result = train(mrpc, str(tmp_path / "mrpc"), tiny_pretrained["prefix"], steps=4,
                      summary_interval=2)
    # Windows (the default): texts are scored, the loss and window_accuracy are per window.
    assert set(result.eval) == {"loss", "accuracy", "f1", "num_examples", "num_windows",
                                "window_accuracy", "cut_texts"}
    assert result.eval["num_examples"] == 40 and 0 <= result.eval["f1"] <= 1
    assert result.eval["num_windows"] >= 40
    assert np.isfinite(result.train["loss"])

    rng = np.random.default_rng(0)
    rows = ["sentence1\tsentence2\tscore"]
    for _ in range(320):  # 0-5 like STS-B: the share of positive words among the pair's six.
        count = int(rng.integers(7))
        words = [*rng.choice(POSITIVE, size=count), *rng.choice(NEGATIVE, size=6 - count)]
        rng.shuffle(words)
        rows.append(f"{' '.join(words[:3])}\t{' '.join(words[3:])}\t{count * 5 / 6:.2f}")
    (tmp_path / "sts.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    sts = make_task("stsb", tiny_pretrained, train_file=str(tmp_path / "sts.tsv"),
                    eval_file=str(tmp_path / "sts.tsv"), max_eval_examples=96, seq_length=16)
    assert sts.best_metric == "pearson"
    _, result = train(sts, str(tmp_path / "sts"), tiny_pretrained["prefix"], steps=80,
                      learning_rate=4e-3, summary_interval=10)
    assert set(result.eval) == {"loss", "pearson", "spearman", "num_examples", "num_windows",
                                "cut_texts"}
    assert result.eval["pearson"] > 0.7, result.eval  # 0.88 when written
    losses = scalar_history(str(tmp_path / "sts"), "loss")
    assert losses[-1] < 0.3 * losses[0], losses  # 8.1 -> 1.0 when written


def test_task_info_rebuilds_a_local_task_with_its_columns(tiny_pretrained, tmp_path):
    """What bert_train.json stores is enough for `evaluate` to rebuild the same task."""
    reviews = tmp_path / "reviews.csv"
    reviews.write_text("id,review,stars\n1,great fun,good\n2,dull,bad\n3,fine,good\n",
                       encoding="utf-8")
    task = make_task("classification", tiny_pretrained, train_file=str(reviews),
                     text_column="review", label_column="2")
    info = task.task_info()
    assert info["label_names"] == ["bad", "good"] and info["columns"]["label"] == 2
    rebuilt = rebuild.task_from_info(info, task.encoder_spec,
                                      data=finetuning.DataConfig(eval_file=str(reviews)))
    assert rebuilt.task_data.columns == task.task_data.columns
    assert rebuilt.task_data.label_names == ("bad", "good")
    assert rebuilt.config.seq_length == 32 and rebuilt.metric_names == ("accuracy",)
    labels = [int(b[F.LABEL_IDS][0]) for b in rebuilt.build_inputs("eval", None,
                                                                    is_training=False).unbatch()
              .batch(1)]
    assert labels == [1, 0, 1]
    assert info["family_module"] == "bert_trainer.tasks.classification.family"
    # A model directory written before families recorded their module names the family only.
    old = {k: v for k, v in info.items() if k != "family_module"}
    again = rebuild.task_from_info(old, task.encoder_spec)
    assert type(again) is type(task) and again.task_data.family is task.task_data.family
    assert again.task_info() == info


def test_mean_pooling_is_recorded_and_rebuilt_by_evaluate_and_export(tiny_pretrained):
    spec = finetuning.spec_from_checkpoint(tiny_pretrained["dir"])
    task = registry.build_task(
        registry.resolve_task_data("sst2", train_file=shared_file("sst2/dev.tsv")), spec,
        config=finetuning.FinetuneConfig(seq_length=32, pooling="mean"))
    assert task.build_model().pooling == "mean"
    info = task.task_info()
    assert info["pooling"] == "mean"
    assert rebuild.task_from_info(info, task.encoder_spec).build_model().pooling == "mean"
    family = plugins.get_family("classification")
    assert family.head_model(task.encoder_spec.build(), info, "here").pooling == "mean"
    old = {k: v for k, v in info.items() if k != "pooling"}  # written before the option
    assert family.head_model(task.encoder_spec.build(), old, "here").pooling == "cls"
    with pytest.raises(UserError, match="here: task.pooling='max' is unknown; use one of cls, "
                                        "mean"):
        family.head_model(task.encoder_spec.build(), {**info, "pooling": "max"}, "here")
    with pytest.raises(UserError, match="FinetuneConfig.pooling='max' is unknown; use cls or "
                                        "mean"):
        finetuning.FinetuneConfig(pooling="max")


def test_epochs_give_the_number_of_steps_and_the_warmup():
    config = finetuning.FinetuneConfig(train_batch_size=32, num_epochs=3.0, warmup_fraction=0.1)
    assert config.train_steps(100) == 10  # ceil(300 / 32)
    assert config.warmup_steps(10) == 1
    assert finetuning.FinetuneConfig(warmup_fraction=None).warmup_steps(10) is None
    with pytest.raises(UserError, match=r"warmup_fraction=1.5 must be in \[0, 1\)"):
        finetuning.FinetuneConfig(warmup_fraction=1.5)


def test_the_trainers_precision_policy_wins_over_the_stored_dtype(
        tiny_pretrained, bfloat16_required):
    """bert_train.json stores dtype float32; a bfloat16 run must still build a mixed encoder."""
    task = make_task("sst2", tiny_pretrained, eval_file=shared_file("sst2/dev.tsv"))
    assert "dtype" not in task.encoder_spec.config
    with optimization.precision_policy("bfloat16"):
        model = task.build_model()
    assert model.encoder.dtype_policy.name == "mixed_bfloat16"
    outputs = model(task.model_inputs(next(iter(task.build_inputs(
        "eval", None, is_training=False)))))
    assert outputs[LOGITS].dtype == "float32"  # The head keeps float32 logits for the loss.
