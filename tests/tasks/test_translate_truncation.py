"""No silent truncation in translation: pairs cut to seq_length / max_target_length
are counted in training and evaluation (the `cut_pairs` metric: logged and in the summaries),
and `predict` marks a cut source `"truncated": true`."""

import numpy as np
import pytest
import tensorflow as tf
from test_translate_task import WORDS, files, make_task  # noqa: F401 (files: a fixture)

from bert_trainer import features as F
from bert_trainer.tasks import plugins
from bert_trainer.tasks.translate import data as translate_data
from bert_trainer.tasks.translate.serving import TranslateServing

LONG = " ".join(["the cat is very big ."] * 3)  # 18 pieces: more than seq_length 12 - 2
BATCH = {translate_data.SOURCE: ["Go.", LONG, "Hi.", "Run!"],
         translate_data.TARGET: ["Ve.", "Hola.", "el gato es muy muy muy grande !", "¡Corre!"]}


def test_cut_pairs_are_marked_and_counted(files):  # noqa: F811
    task = make_task(files)  # seq_length 12, max_target_length 8: a target keeps 7 pieces
    batch = translate_data.pair_features(
        task.tokenizer, {k: tf.constant(v) for k, v in BATCH.items()}, 12, 8)
    np.testing.assert_array_equal(batch[translate_data.CUT].numpy(), [0, 1, 1, 0])
    assert translate_data.CUT not in task.model_inputs(batch)  # the model never sees it
    metrics = task.build_metrics(training=True)
    assert [m.name for m in metrics] == ["token_accuracy", "cut_pairs"]
    logits = np.zeros((4, 8, len(WORDS) + 5), np.float32)
    for _ in range(2):  # two batches between summaries: counted, not averaged
        task.update_metrics(metrics, batch, {F.LOGITS: tf.constant(logits)})
    assert float(metrics[1].result()) == 4.0


def test_predict_marks_a_cut_source(files):  # noqa: F811
    task = make_task(files)
    module = TranslateServing(task.model, beam_size=1, max_decode_length=6,
                              vocab_file=files["vocab"], lower_case=True, seq_length=12)
    out = {k: v.numpy() for k, v in
           module.text_function()(input=tf.constant(["Go.", LONG])).items()}
    np.testing.assert_array_equal(out["truncated"], [False, True])
    family = plugins.get_family("translate")
    assert "truncated" not in family.format_answer(out, 0)
    assert family.format_answer(out, 1)["truncated"] is True
    older = {k: v for k, v in out.items() if k != "truncated"}  # an export made before
    assert set(family.format_answer(older, 1)) == {"translation", "score"}


@pytest.mark.parametrize("split", ["eval"])
def test_evaluation_batches_carry_the_cut_marks(files, split):  # noqa: F811
    task = make_task(files)
    batches = list(task.build_inputs(split, None, is_training=False))
    assert sum(int(b[translate_data.CUT].numpy().sum()) for b in batches) == 0  # PAIRS fit
    assert all(b[translate_data.CUT].shape[0] == b[F.TARGET_IDS].shape[0] for b in batches)
