"""Length buckets: the widths chosen, the batches cut to them, and the same losses as padding."""

import dataclasses
import itertools

import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO, TESTS
from finetune_testing import make_task, shared_file
from numerics import assert_close

from bert_trainer import features as F
from bert_trainer.data import length_buckets
from bert_trainer.training import OptimizerConfig, Trainer, TrainerConfig

SEQ = 64


def padded_slots(boundaries, lengths) -> int:
    return int(np.sum(np.asarray(boundaries)[np.searchsorted(boundaries, lengths)]))


def test_widths_pad_least_of_every_choice():
    """Brute force over every set of widths on a small grid: the dynamic programme's is best."""
    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(2.8, 0.6, 500).astype(int), 2, 47)
    for max_buckets in (1, 2, 3, 4):
        chosen = length_buckets.choose_boundaries(lengths, 48, max_buckets)
        assert chosen[-1] == 48 and len(chosen) <= max_buckets
        assert all(w % length_buckets.MULTIPLE == 0 for w in chosen)
        grid = [8, 16, 24, 32, 40]
        best = min(padded_slots((*c, 48), lengths) for k in range(max_buckets)
                   for c in itertools.combinations(grid, k))
        assert padded_slots(chosen, lengths) == best


def test_widths_hold_the_longest_example_and_end_at_seq_length():
    assert length_buckets.choose_boundaries([5, 5, 5], 128, 8) == (8, 128)
    assert length_buckets.choose_boundaries([128, 3], 128, 8) == (8, 128)
    assert length_buckets.choose_boundaries([3, 100], 128, 2) == (8, 128)
    assert length_buckets.choose_boundaries([40], 128, 1) == (128,)
    assert length_buckets.choose_boundaries([], 128, 8) == (128,)
    widths = length_buckets.choose_boundaries([3, 100], 512, 4)
    assert widths == (8, 104, 512)


@pytest.fixture(scope="module")
def sst2_phrases(tmp_path_factory):
    """The first 400 rows of SST-2's training file: phrases of 1 to about 50 words."""
    with open(shared_file("sst2/train.tsv"), encoding="utf-8") as f:
        lines = [next(f) for _ in range(401)]
    path = tmp_path_factory.mktemp("sst2") / "train.tsv"
    path.write_text("".join(lines), encoding="utf-8")
    return str(path)


CONLL_SENTENCES = 250  # more than any test reads (200 training, 96 evaluation examples)


@pytest.fixture(scope="module")
def conll_sentences(tmp_path_factory):
    """The first 250 sentences of CoNLL-2003's eng.testa: each task reads its first examples
    only, but building a pipeline reads (and normalizes) its whole file, 3,250 sentences."""
    lines, sentences, words = [], 0, False
    with open(shared_file("conll2003/eng.testa"), encoding="utf-8") as f:
        for line in f:
            lines.append(line)
            if not line.split():
                sentences += words
                words = False
                if sentences == CONLL_SENTENCES:
                    break
            elif not line.startswith("-DOCSTART-"):
                words = True
    assert sentences == CONLL_SENTENCES
    path = tmp_path_factory.mktemp("conll") / "eng.testa"
    path.write_text("".join(lines), encoding="utf-8")
    return str(path)


def sst2_task(pretrained, buckets, file, group=False, **kwargs):
    task = make_task("sst2", pretrained, train_file=file, eval_file=file, seq_length=SEQ,
                     max_train_examples=300, max_eval_examples=100, eval_batch_size=8,
                     **kwargs)
    task.config = dataclasses.replace(task.config, length_buckets=buckets,
                                      group_by_length=group)
    return task


def conll_task(pretrained, buckets, file):
    task = make_task("conll2003", pretrained, train_file=file, eval_file=file, seq_length=SEQ,
                     max_train_examples=200, max_eval_examples=96, eval_batch_size=2)
    task.config = dataclasses.replace(task.config, length_buckets=buckets)
    return task


def first_batches(task, n, *, is_training=True):
    data = task.build_inputs(task.train_split if is_training else task.eval_split, None,
                             is_training=is_training)
    return [{k: v.numpy() for k, v in b.items()} for b in data.take(n)]


@pytest.fixture(scope="module")
def pipelines(tiny_pretrained, sst2_phrases, conll_sentences):
    """The first batches of the pipelines several tests read, each built once per file: a
    pipeline traces its tokenizing functions when built (seconds each), and a pipeline's
    batches do not change between builds (the grouped test checks a rebuild on its own).

    `pipelines(data, buckets, n, is_training=...)` -> (task, its first n batches), data
    "sst2" or "conll"; `pipelines("conll", "model")`: one tagging model for the tests."""
    made = {}

    def get(data, buckets, n=None, *, is_training=True):
        key = (data, buckets, is_training)
        if buckets == "model":
            if key not in made:
                made[key] = conll_task(tiny_pretrained, 8, conll_sentences).build_model()
            return made[key]
        if key not in made:
            task = (conll_task(tiny_pretrained, buckets, conll_sentences) if data == "conll"
                    else sst2_task(tiny_pretrained, buckets, sst2_phrases))
            made[key] = task, first_batches(task, SHARED_BATCHES, is_training=is_training)
        task, batches = made[key]
        assert n <= len(batches)
        return task, batches[:n]

    return get


SHARED_BATCHES = 12  # the most any test reads


def test_training_batches_are_the_padded_ones_cut(shared_dir, pipelines):
    """By default the order (and so each batch's examples) is the padded pipeline's."""
    _, padded = pipelines("sst2", 0, 12)
    _, cut = pipelines("sst2", 4, 12)
    widths = [b[F.INPUT_WORD_IDS].shape[1] for b in cut]
    assert len(set(widths)) > 1 and min(widths) < SEQ
    for full, short, width in zip(padded, cut, widths, strict=True):
        np.testing.assert_array_equal(full[F.LABEL_IDS], short[F.LABEL_IDS])
        for key in F.ENCODER_INPUTS:
            np.testing.assert_array_equal(full[key][:, :width], short[key])
        assert not full[F.INPUT_MASK][:, width:].any()  # only padding was cut
        assert width % length_buckets.MULTIPLE == 0 or width == SEQ


def test_grouped_training_batches_hold_one_bucket_and_repeat_exactly(shared_dir,
                                                                     tiny_pretrained,
                                                                     sst2_phrases):
    task = sst2_task(tiny_pretrained, 4, sst2_phrases, group=True)
    batches = first_batches(task, 12)
    widths = [b[F.INPUT_WORD_IDS].shape[1] for b in batches]
    assert all(b[F.INPUT_WORD_IDS].shape[0] == task.config.train_batch_size for b in batches)
    assert len(set(widths)) > 1 and min(widths) < SEQ  # short batches, of several widths
    for batch, width in zip(batches, widths, strict=True):
        lengths = batch[F.INPUT_MASK].sum(axis=1)
        assert lengths.max() <= width
        # One bucket: no example fits a narrower width of the run.
        narrower = [w for w in set(widths) if w < width]
        if narrower:
            assert lengths.min() > max(narrower)
    # A rebuilt pipeline gives the same batches (the trainer's resume skips into it).
    again = first_batches(task, 12)
    for a, b in zip(batches, again, strict=True):
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])


def test_every_example_keeps_its_tokens_when_cut(shared_dir, pipelines):
    _, padded = pipelines("sst2", 0, 5, is_training=False)
    _, cut = pipelines("sst2", 8, 5, is_training=False)
    assert [b[F.LABEL_IDS].tolist() for b in padded] == [b[F.LABEL_IDS].tolist() for b in cut]
    assert min(b[F.INPUT_WORD_IDS].shape[1] for b in cut) < SEQ
    for full, short in zip(padded, cut, strict=True):
        width = short[F.INPUT_WORD_IDS].shape[1]
        for key in F.ENCODER_INPUTS:
            np.testing.assert_array_equal(full[key][:, :width], short[key])
            assert not full[F.INPUT_MASK][:, width:].any()  # only padding was cut


def per_example_losses(task, model, batches):
    losses = []
    for batch in batches:
        outputs = model(task.model_inputs(batch), training=False)
        losses.append(task.build_losses(batch, outputs)["loss"].numpy())
    return np.concatenate(losses)


@pytest.mark.parametrize("family", ["classification", "tagging"])
def test_cut_batches_give_the_losses_of_padded_ones(shared_dir, pipelines, family):
    data = "conll" if family == "tagging" else "sst2"
    padded_task, padded = pipelines(data, 0, 6, is_training=False)
    cut_task, cut = pipelines(data, 8, 6, is_training=False)
    model = pipelines("conll", "model") if family == "tagging" else padded_task.build_model()
    assert any(b[F.INPUT_WORD_IDS].shape[1] < SEQ for b in cut)
    assert_close(per_example_losses(cut_task, model, cut),
                 per_example_losses(padded_task, model, padded))


def test_tagging_eval_outputs_come_back_at_full_width(shared_dir, pipelines):
    task, (batch,) = pipelines("conll", 8, 1, is_training=False)  # 2 sentences: 13 and 8 pieces
    model = pipelines("conll", "model")
    width = batch[F.INPUT_WORD_IDS].shape[1]
    assert width < SEQ
    outputs = task.eval_step_outputs(batch, model(task.model_inputs(batch), training=False))
    labels = outputs[F.LABEL_IDS].numpy()
    assert labels.shape == (len(batch[F.LABEL_IDS]), SEQ)
    np.testing.assert_array_equal(labels[:, :width], batch[F.LABEL_IDS])
    assert (labels[:, width:] == F.IGNORE_LABEL).all()


def test_off_keeps_every_batch_at_seq_length(shared_dir, pipelines):
    _, batches = pipelines("sst2", 0, 4)
    widths = {b[F.INPUT_WORD_IDS].shape[1] for b in batches}
    assert widths == {SEQ}


@pytest.mark.slow  # trains twice in this process
def test_resume_with_buckets_ends_with_the_weights_of_a_straight_run(shared_dir, tiny_pretrained,
                                                                     sst2_phrases, tmp_path):
    optimizer = OptimizerConfig(learning_rate=1e-3, warmup_steps=2, decay_steps=40)

    def run(model_dir, steps):
        task = sst2_task(tiny_pretrained, 4, sst2_phrases, dropout_rate=0.1)
        config = TrainerConfig(train_steps=steps, steps_per_loop=3, checkpoint_interval=3,
                               summary_interval=3, eval_steps=0,
                               init_checkpoint=tiny_pretrained["prefix"])
        trainer = Trainer(task, str(model_dir), config=config, optimizer=optimizer)
        trainer.train_and_evaluate()
        return [v.numpy() for v in trainer.model.trainable_variables]

    straight = run(tmp_path / "straight", 9)
    run(tmp_path / "resumed", 3)
    tf.keras.backend.clear_session()
    resumed = run(tmp_path / "resumed", 9)
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(straight, resumed, strict=True)) \
        <= 1e-6


MIRRORED_SCRIPT = """
import json, sys
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from finetune_testing import make_task
from bert_trainer.training import OptimizerConfig, Trainer, TrainerConfig

task = make_task("conll2003", {"dir": sys.argv[2]}, train_file=sys.argv[3],
                 eval_file=sys.argv[3], seq_length=64,
                 max_train_examples=64, max_eval_examples=30, train_batch_size=8,
                 eval_batch_size=4)
strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
trainer = Trainer(task, sys.argv[1], strategy=strategy, optimizer=OptimizerConfig(),
                  config=TrainerConfig(train_steps=3, steps_per_loop=3, summary_interval=3))
result = trainer.train_and_evaluate()
print("RESULT " + json.dumps({"loss": result.train["loss"], "eval": result.eval}))
"""


@pytest.mark.slow  # a subprocess: logical devices must be set before TensorFlow starts
def test_cut_batches_train_and_evaluate_over_two_mirrored_replicas(shared_dir, tiny_pretrained,
                                                                   conll_sentences, tmp_path):
    """Each replica cuts its own batch: per-token eval outputs of different widths gather."""
    import json  # noqa: PLC0415
    import os  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2",
               PYTHONPATH=os.pathsep.join([str(TESTS), str(REPO)]))
    proc = subprocess.run([sys.executable, "-c", MIRRORED_SCRIPT, str(tmp_path / "run"),
                           tiny_pretrained["dir"], conll_sentences], env=env,
                          capture_output=True, text=True, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT "):])
    assert np.isfinite(result["loss"]) and result["eval"]["num_sentences"] == 30
    assert 0 <= result["eval"]["f1"] <= 1


def test_pad_to_width_keeps_dtype_and_values():
    values = tf.constant([[1, 2], [3, 4]], tf.int32)
    padded = length_buckets.pad_to_width(values, 4, -1)
    np.testing.assert_array_equal(padded, [[1, 2, -1, -1], [3, 4, -1, -1]])
    flags = length_buckets.pad_to_width(tf.constant([[True], [False]]), 3)
    assert flags.dtype == tf.bool
    np.testing.assert_array_equal(flags, [[True, False, False], [False, False, False]])
