"""CausalLMTask: next-token loss, perplexity and accuracy against numpy; its input pipeline;
bert_train.json; the checks before training."""

import json

import gin
import keras
import numpy as np
import pytest
import tensorflow as tf

from bert_trainer import features as F
from bert_trainer.checkpoints import model_dir as model_dir_lib
from bert_trainer.data.corpus_options import CorpusOptions
from bert_trainer.errors import UserError
from bert_trainer.models.causal_lm import CausalLM
from bert_trainer.tasks.causal_lm import corpus as causal_lm_data
from bert_trainer.tasks.causal_lm import data as causal_lm_pipeline
from bert_trainer.tasks.causal_lm.task import CausalLMConfig, CausalLMTask, Perplexity
from bert_trainer.tasks.masked_lm import corpus as cpd

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghijklmnopqrstuvwxyz.",
         *(f"w{i}" for i in range(21))]  # 53 tokens


@pytest.fixture(autouse=True)
def clean_state():
    gin.clear_config()
    keras.backend.clear_session()
    yield
    gin.clear_config()


@pytest.fixture
def vocab_file(tmp_path):
    path = tmp_path / "vocab.txt"
    path.write_text("".join(t + "\n" for t in VOCAB), encoding="utf-8")
    return str(path)


def tiny_model(**overrides):
    keras.utils.set_random_seed(1)
    args = dict(vocab_size=len(VOCAB), hidden_size=16, num_layers=1, num_attention_heads=2,
                inner_dim=32, max_sequence_length=16, output_dropout=0.0,
                attention_dropout=0.0)
    return CausalLM(**{**args, **overrides})


def make_task(vocab_file, **config):
    task = CausalLMTask(CausalLMConfig(vocab_file=vocab_file, block_size=8, **config),
                        tiny_model)
    return task, task.build_model()


def log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def numpy_next_token(ids, logits, mask=None):
    """Token losses [b, t-1], hits [b, t-1] and weights [b, t-1], by hand."""
    labels = ids[:, 1:]
    logp = log_softmax(logits[:, :-1].astype(np.float64))
    xent = -np.take_along_axis(logp, labels[..., None], -1)[..., 0]
    hits = (logits[:, :-1].argmax(-1) == labels).astype(np.float64)
    weights = np.ones_like(xent) if mask is None else (mask[:, 1:] != 0).astype(np.float64)
    return xent, hits, weights


def batch(seed, rows=3, length=8, padded=0):
    ids = np.random.default_rng(seed).integers(5, len(VOCAB), (rows, length)).astype(np.int32)
    mask = np.ones_like(ids)
    if padded:
        mask[0, -padded:] = 0
        ids[0, -padded:] = 0
    return {F.INPUT_WORD_IDS: ids, F.INPUT_MASK: mask}


def test_loss_is_the_mean_next_token_cross_entropy(vocab_file):
    task, model = make_task(vocab_file)
    for features in (batch(0), batch(1, padded=3)):
        outputs = model(task.model_inputs(features), training=False)
        loss = task.build_losses(features, outputs)["loss"].numpy()
        xent, _, w = numpy_next_token(features[F.INPUT_WORD_IDS],
                                      outputs[F.LOGITS].numpy(), features[F.INPUT_MASK])
        want = (xent * w).sum(-1) / w.sum(-1)
        assert loss.shape == (3,)
        np.testing.assert_allclose(loss, want, rtol=1e-5, atol=1e-5)
    # The padded row's loss counts its 4 real targets only (positions 1..4 of 8).
    assert w[0].sum() == 4 and w[1].sum() == 7


def test_perplexity_and_accuracy_over_batches_of_different_token_counts(vocab_file):
    task, model = make_task(vocab_file)
    metrics = task.build_metrics(training=False)
    all_xent, all_hits, all_w, per_batch = [], [], [], []
    for features in (batch(2, rows=1), batch(3, rows=4, padded=5), batch(4, rows=2)):
        outputs = model(task.model_inputs(features), training=False)
        task.update_metrics(metrics, features, outputs)
        xent, hits, w = numpy_next_token(features[F.INPUT_WORD_IDS],
                                         outputs[F.LOGITS].numpy(), features[F.INPUT_MASK])
        all_xent.append((xent * w).ravel())
        all_hits.append((hits * w).ravel())
        all_w.append(w.ravel())
        per_batch.append(np.exp((xent * w).sum() / w.sum()))
    tokens = np.concatenate(all_w).sum()
    assert tokens == 7 + 4 * 7 - 5 + 2 * 7
    mean_loss = np.concatenate(all_xent).sum() / tokens
    perplexity = float(metrics[0].result())
    np.testing.assert_allclose(perplexity, np.exp(mean_loss), rtol=1e-5)
    assert abs(perplexity - np.mean(per_batch)) > 1e-3  # not a mean of per-batch exps
    np.testing.assert_allclose(float(metrics[1].result()),
                               np.concatenate(all_hits).sum() / tokens, rtol=1e-6)
    assert 20 < perplexity < 200  # a random model: about the vocabulary's size


def test_perplexity_metric_alone():
    metric = Perplexity()
    metric.update_state(tf.constant([1.0, 2.0]), sample_weight=tf.constant([1.0, 1.0]))
    metric.update_state(tf.constant([[4.0, 9.0]]), sample_weight=tf.constant([[1.0, 0.0]]))
    np.testing.assert_allclose(float(metric.result()), np.exp(7.0 / 3.0), rtol=1e-6)
    metric.reset_state()
    assert float(metric.result()) == 1.0  # exp(0) with nothing seen


def test_model_info_and_resume_checks(vocab_file, tmp_path):
    task, model = make_task(vocab_file)
    task.write_model_info(str(tmp_path / "run"))
    info = json.loads((tmp_path / "run" / "bert_train.json").read_text())
    assert info["encoder"]["class_name"] == "CausalLM"
    assert info["task"] == {"name": "causal_lm", "family": "causal_lm", "block_size": 8}
    assert (tmp_path / "run" / "vocab.txt").read_text() == "".join(t + "\n" for t in VOCAB)
    rebuilt = model_dir_lib.build_encoder(model_dir_lib.read_model_info(str(tmp_path / "run")))
    assert isinstance(rebuilt, CausalLM) and rebuilt.get_config() == model.get_config()
    task.check_resume(str(tmp_path / "run"))  # the same model: accepted
    (tmp_path / "run" / "ckpt-1.index").write_bytes(b"")  # a resume is checked, not a fresh run
    task.check_resume(str(tmp_path / "run"))
    other = CausalLMTask(CausalLMConfig(vocab_file=vocab_file, block_size=8),
                         lambda: tiny_model(num_layers=2))
    other.build_model()
    with pytest.raises(UserError, match="another architecture"):
        other.check_resume(str(tmp_path / "run"))


def test_build_model_refuses_what_does_not_fit(vocab_file, tmp_path):
    with pytest.raises(UserError, match=r"CausalLMConfig.block_size=32 exceeds the model's "
                                        r"max_sequence_length=16"):
        CausalLMTask(CausalLMConfig(vocab_file=vocab_file, block_size=32),
                     tiny_model).build_model()
    with pytest.raises(UserError, match=r"has 53 tokens but the model's vocab_size is 60; set "
                                        r"build_causal_lm.vocab_size = 53"):
        CausalLMTask(CausalLMConfig(vocab_file=vocab_file, block_size=8),
                     lambda: tiny_model(vocab_size=60)).build_model()
    with pytest.raises(UserError, match="block_size=1 must be >= 2"):
        CausalLMConfig(vocab_file=vocab_file, block_size=1)
    with pytest.raises(UserError, match="CausalLMConfig.vocab_file is not set"):
        CausalLMConfig()


def test_flops_counter_counts_the_training_call(vocab_file):
    task, model = make_task(vocab_file)
    features = batch(5)  # 3 blocks of 8 tokens
    flops = float(task.flops_counter(model)(
        features, model(task.model_inputs(features), training=True)))
    # forward x 3: per token the layer's matmuls and the tied projection, per block attention.
    h, f, s, vocab = 16, 32, 8, len(VOCAB)
    forward = s * (2 * (4 * h * h + 2 * h * f) + 2 * h * vocab) + 2 * 2 * s * s * h
    assert flops == pytest.approx(3 * 3 * forward, rel=1e-6)


# ---------------------------------------------------------------------------- the pipeline


@pytest.fixture
def blocks(tmp_path, vocab_file):
    """300 tiny documents as 4 shards of blocks of 8 tokens."""
    text = tmp_path / "docs.txt"
    rng = np.random.default_rng(0)
    words = VOCAB[5:]
    text.write_text("\n\n".join(" ".join(rng.choice(words, d % 7 + 1)) for d in range(300)),
                    encoding="utf-8")
    summary = causal_lm_data.create_causal_lm_data(
        str(text), vocab_file, str(tmp_path / "b" / "t-*.tfrecord"),
        causal_lm_data.CausalDataConfig(block_size=8),
        options=CorpusOptions(input_format="lines", num_shards=4),
        progress=None)
    return str(tmp_path / "b" / "t-*.tfrecord"), summary


def rows(dataset, n=None):
    out = []
    for b in dataset.take(n) if n else dataset:
        assert set(b) == {F.INPUT_WORD_IDS, F.INPUT_MASK}
        assert b[F.INPUT_WORD_IDS].dtype == tf.int32 and np.all(b[F.INPUT_MASK] == 1)
        out.extend(map(tuple, b[F.INPUT_WORD_IDS].numpy()))
    return out


def test_pipeline_reads_every_block_once_and_shuffles_deterministically(blocks):
    pattern, summary = blocks
    evaluation = rows(causal_lm_pipeline.causal_lm_dataset(pattern, block_size=8, batch_size=7,
                                                           is_training=False))
    assert len(evaluation) == len(set(evaluation)) == summary["examples"] > 100
    train = [rows(causal_lm_pipeline.causal_lm_dataset(
        pattern, block_size=8, batch_size=4, shuffle_buffer=50, seed=seed,
        deterministic=True), 30) for seed in (1, 1, 2)]
    assert train[0] == train[1] and train[0] != train[2]
    assert set(train[0]) <= set(evaluation)
    # Two input pipelines read disjoint halves of the shards.
    halves = [set(rows(causal_lm_pipeline.causal_lm_dataset(
        pattern, block_size=8, batch_size=5, is_training=False,
        input_context=tf.distribute.InputContext(2, i, 2)))) for i in range(2)]
    assert not halves[0] & halves[1] and halves[0] | halves[1] == set(evaluation)


def test_pipeline_refuses_other_records(blocks, tmp_path, vocab_file, minilm_dir):
    pattern, _ = blocks
    with pytest.raises(UserError, match=r"has blocks of 8 tokens but CausalLMConfig.block_size"
                                        r"=16; pass CausalLMConfig.block_size = 8"):
        causal_lm_pipeline.causal_lm_dataset(pattern, block_size=16, batch_size=2)
    text = tmp_path / "pairs.txt"
    text.write_text("the cat sat .\nit was fine .\n\nthe dog ran .\nit ran far .\n" * 5)
    cpd.create_pretraining_data(str(text), str(minilm_dir / "vocab.txt"),
                                str(tmp_path / "m" / "t-*.tfrecord"),
                                cpd.PretrainingDataConfig(max_seq_length=16), progress=None)
    with pytest.raises(UserError, match=r"t-00000-of-00001.tfrecord holds masked-LM examples, "
                                        r"not causal-LM blocks; make it with 'bert-train "
                                        r"create_pretraining_data --objective=causal_lm'"):
        causal_lm_pipeline.causal_lm_dataset(str(tmp_path / "m" / "t-*.tfrecord"),
                                             block_size=16, batch_size=2)
    with pytest.raises(UserError, match="causal-LM data '.*nothing-\\*' matches no file"):
        causal_lm_pipeline.causal_lm_dataset(str(tmp_path / "nothing-*"), block_size=8,
                                             batch_size=2)


# ------------------------------------------------------------------- warm start, gin configs


def test_initialize_warm_starts_every_weight_from_a_causal_model_dir(vocab_file, tmp_path):
    from bert_trainer.checkpoints import layout  # noqa: PLC0415
    from bert_trainer.interop import resolve  # noqa: PLC0415

    task, trained = make_task(vocab_file)
    for variable in trained.weights:
        variable.assign(variable + 0.5)
    task.write_model_info(str(tmp_path / "run"))
    tf.train.Checkpoint(model=layout.model_trackable(trained)).write(str(tmp_path / "run" /
                                                                         "ckpt-7"))
    (tmp_path / "run" / "checkpoint").write_text('model_checkpoint_path: "ckpt-7"\n')
    checkpoint = resolve.as_resolved(str(tmp_path / "run"))
    # As `bert-train pretrain --init_checkpoint`: the directory's model info builds the model.
    fresh_task = CausalLMTask(CausalLMConfig(vocab_file=vocab_file, block_size=8),
                              checkpoint.build_encoder, checkpoint=checkpoint)
    fresh = fresh_task.build_model()
    assert isinstance(fresh, CausalLM)
    assert max(np.abs(a.numpy() - b.numpy()).max()
               for a, b in zip(fresh.weights, trained.weights, strict=True)) >= 0.4
    fresh_task.initialize(fresh, checkpoint.path)
    for a, b in zip(fresh.weights, trained.weights, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy(), err_msg=a.path)


@pytest.mark.parametrize("name, sizes", [
    ("tiny", (2, 128, 2, 512, 128, 128)),
    ("mini", (4, 256, 4, 1024, 256, 256)),
    ("small", (6, 512, 8, 2048, 512, 256)),
    ("gpt2_small", (12, 768, 12, 3072, 1024, 1024)),
])
def test_shipped_configs(name, sizes, vocab_file):
    from bert_trainer import configurables  # noqa: PLC0415
    from bert_trainer.runs import gin_config  # noqa: PLC0415

    gin_config.parse_gin([f"configs/causal_lm/{name}.gin"], [], [])
    assert configurables.pretraining_objective() == "causal_lm"
    got = tuple(gin.query_parameter(f"build_causal_lm.{key}") for key in (
        "num_layers", "hidden_size", "num_attention_heads", "inner_dim", "max_sequence_length"))
    config = configurables.CausalLMConfig(vocab_file=vocab_file)
    assert (*got, config.block_size) == sizes
    assert gin.query_parameter("build_causal_lm.norm_first") is True
    if name in ("tiny", "mini"):  # built: the sizes make a model (GPT-2 small's take seconds)
        model = configurables.build_causal_lm(vocab_size=len(VOCAB))
        assert (model.num_layers, model.hidden_size) == sizes[:2]


# ------------------------------------------------------------------------------ strategies

# Logical CPU devices must be configured before TensorFlow initializes its devices, which the
# test process has already done: the comparison runs in a fresh interpreter.
MIRRORED_SCRIPT = """
import json, sys
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from bert_trainer.models.causal_lm import CausalLM
from bert_trainer.tasks.causal_lm.task import CausalLMConfig, CausalLMTask
from bert_trainer.training.optimization import OptimizerConfig
from bert_trainer.training.trainer import Trainer, TrainerConfig

root, vocab, blocks = sys.argv[1:4]

def run(strategy, model_dir):
    config = CausalLMConfig(train_data=blocks, eval_data=blocks, vocab_file=vocab, block_size=8,
                            train_batch_size=8, eval_batch_size=6, shuffle_buffer=50)
    task = CausalLMTask(config, lambda: CausalLM(
        vocab_size=53, hidden_size=16, num_layers=1, num_attention_heads=2, inner_dim=32,
        max_sequence_length=8, output_dropout=0.0, attention_dropout=0.0))
    trainer = Trainer(task, model_dir, strategy=strategy,
                      config=TrainerConfig(train_steps=4, steps_per_loop=2, summary_interval=4),
                      optimizer=OptimizerConfig(learning_rate=1e-2, warmup_steps=1))
    result = trainer.train_and_evaluate()
    return result.eval, [v.numpy() for v in trainer.model.trainable_variables]

one, w1 = run(None, f"{root}/one")
two, w2 = run(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]), f"{root}/two")
print("RESULT " + json.dumps({"eval": [one, two], "max_weight_difference": max(
    float(np.abs(a - b).max()) for a, b in zip(w1, w2))}))
"""


@pytest.mark.slow
def test_mirrored_over_two_cpus_matches_one_device(blocks, vocab_file, tmp_path):
    import os  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    from robust_testing import subprocess_env  # noqa: PLC0415

    pattern, summary = blocks
    proc = subprocess.run([sys.executable, "-c", MIRRORED_SCRIPT, str(tmp_path), vocab_file,
                           pattern], env=subprocess_env(), capture_output=True, text=True,
                          timeout=600, cwd=os.getcwd())
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    result = json.loads(lines[-1][len("RESULT "):])
    one, two = result["eval"]
    # The whole eval split, its last batch uneven over the two replicas: the perplexity sums
    # token losses and counts over replicas and batches before the exp.
    assert summary["examples"] % 6 != 0, summary["examples"]
    for name in ("loss", "perplexity", "next_token_accuracy"):
        assert two[name] == pytest.approx(one[name], rel=1e-5), (name, one, two)
    assert one["perplexity"] == pytest.approx(np.exp(one["loss"]), rel=1e-5)  # full blocks
    assert result["max_weight_difference"] < 1e-5
