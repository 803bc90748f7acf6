"""The export reads what the real fine-tuning tasks and Trainer write.

A classifier fine-tuned by the Trainer (two steps, one evaluation, so best/ exists) is wrapped
for serving and answers like the trained in-memory model; the SQuAD and tagging task models
restore into their serving modules with the task's stored options.
"""

import numpy as np
import pytest
import tensorflow as tf
from export_testing import save_checkpoint
from finetune_testing import make_task, shared_file, train

from bert_trainer import ops
from bert_trainer.export import build_serving_module
from bert_trainer.tasks.classification.data import text_features
from bert_trainer.tasks.squad.task import SquadConfig
from bert_trainer.tasks.tagging.family import CONLL2003_LABELS

SENTENCES = ["a gripping , funny and moving film .", "dull and lifeless .", "Ça ira"]


@pytest.mark.slow  # trains end to end in this process: left out of make test-fast
def test_trainer_fine_tuned_classifier_serves_like_the_trained_model(tiny_pretrained, tmp_path):
    dev = shared_file("sst2/dev.tsv")
    task = make_task("sst2", tiny_pretrained, train_file=dev, eval_file=dev,
                     max_train_examples=32, max_eval_examples=16, seq_length=32)
    train(task, str(tmp_path), tiny_pretrained["dir"], steps=2, eval_steps=1,
          learning_rate=1e-2)
    assert list((tmp_path / "best").glob("ckpt-2.index"))
    module = build_serving_module(str(tmp_path))  # default: the best checkpoint
    assert (module.family, module.seq_length, module.label_names) == (
        "classification", 32, ("negative", "positive"))
    inputs = text_features(task.tokenizer, {"text": tf.constant(SENTENCES)}, 32)
    expected = tf.nn.softmax(task.model(inputs, training=False)["logits"]).numpy()
    got = module.text_function()(tf.constant(SENTENCES))["probabilities"].numpy()
    assert np.abs(got - expected).max() <= 1e-5


@pytest.mark.parametrize("name", ["squad", "conll2003"])
def test_task_models_restore_into_their_serving_modules(tiny_pretrained, tmp_path, name):
    options = {"squad": SquadConfig(doc_stride=7, max_query_length=9)} if name == "squad" else {}
    task = make_task(name, tiny_pretrained, seq_length=32, task_options=options)
    model = task.build_model()
    rng = np.random.default_rng(0)
    for variable in model.weights:  # Not the initial values: a restore must be visible.
        variable.assign(rng.normal(scale=0.1, size=variable.shape).astype(np.float32))
    task.write_model_info(str(tmp_path))
    save_checkpoint(model, str(tmp_path), step=5)
    module = build_serving_module(str(tmp_path))
    if name == "squad":
        assert (module.family, module.doc_stride, module.max_query_length, module.version_2) == (
            "squad", 7, 9, False)
    else:
        assert (module.family, module.label_names) == ("tagging", CONLL2003_LABELS)
    ids = text_features(task.tokenizer, {"text": tf.constant(SENTENCES)}, 32)
    with ops.portable():  # the serving module's ops (packing changes padding logits)
        expected = model(ids, training=False)
    got = module.function("serving_ids")(**ids)
    assert set(got) == set(expected)
    for key, value in expected.items():
        assert np.abs(got[key].numpy() - value.numpy()).max() <= 1e-5, key
