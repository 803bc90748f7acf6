"""TranslationTask: label-smoothed loss per target token, token accuracy, BLEU of in-graph
decoding against the reference texts, its options and their limits; TranslateServing."""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from bert_trainer import features as F
from bert_trainer.encoders import BertEncoder
from bert_trainer.errors import UserError
from bert_trainer.metrics.bleu import corpus_bleu
from bert_trainer.serving import ENCODE, SERVING_DEFAULT
from bert_trainer.tasks import plugins, registry
from bert_trainer.tasks.finetuning import DataConfig, FinetuneConfig, spec_from_encoder
from bert_trainer.tasks.translate import data as translate_data
from bert_trainer.tasks.translate.serving import TranslateServing
from bert_trainer.tasks.translate.task import TranslateConfig, text_like_vocabulary

WORDS = ["go", "hi", "ve", "hola", "run", "corre", "the", "cat", "el", "gato", "is", "es",
         "big", "grande", ".", "!", "¡", "very", "muy"]
PAIRS = [("Go.", "Ve."), ("Hi.", "Hola."), ("Run!", "¡Corre!"), ("The cat is big.",
                                                                 "El gato es grande.")]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("translate_task")
    vocab = root / "vocab.txt"
    vocab.write_text("".join(t + "\n" for t in ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
                                                *WORDS]), encoding="utf-8")
    pairs = root / "pairs.tsv"
    pairs.write_text("english\tspanish\n" + "".join(f"{s}\t{t}\n" for s, t in PAIRS),
                     encoding="utf-8")
    return {"vocab": str(vocab), "pairs": str(pairs)}


def make_task(files, **options):
    keras.utils.set_random_seed(1)
    encoder = BertEncoder(vocab_size=len(WORDS) + 5, hidden_size=16, num_layers=1,
                          num_attention_heads=2, inner_dim=32, max_sequence_length=16)
    spec = spec_from_encoder(encoder, vocab_file=files["vocab"], lower_case=True)
    td = registry.resolve_task_data("translate")
    config = TranslateConfig(**{"max_target_length": 8, "max_decode_length": 6, **options})
    task = registry.build_task(td, spec, config=FinetuneConfig(seq_length=12, eval_batch_size=4),
                               data=DataConfig(train_file=files["pairs"],
                                               eval_file=files["pairs"]), translate=config)
    task.build_model()
    return task


@pytest.fixture(scope="module")
def default_task(files):
    """`make_task(files)`, built once for the tests that only read it."""
    return make_task(files)


def test_loss_is_keras_label_smoothed_cross_entropy_averaged_per_target_token(default_task,
                                                                             files):
    task = default_task
    rng = np.random.default_rng(0)
    vocab = len(WORDS) + 5
    logits = rng.normal(size=(3, 5, vocab)).astype(np.float32)
    targets = np.array([[7, 9, 3, 0, 0], [5, 3, 0, 0, 0], [6, 8, 10, 11, 3]], np.int32)
    losses = task.build_losses({F.TARGET_IDS: tf.constant(targets)},
                               {F.LOGITS: tf.constant(logits)})
    assert set(losses) == set(task.loss_names) == {"loss"}
    xent = keras.losses.categorical_crossentropy(
        tf.one_hot(targets, vocab), logits, from_logits=True, label_smoothing=0.1).numpy()
    mask = targets != 0
    expected = (xent * mask).sum(1) / mask.sum(1)
    np.testing.assert_allclose(losses["loss"].numpy(), expected, rtol=1e-5, atol=1e-6)
    # Without smoothing it is the plain cross-entropy of the target tokens.
    plain = make_task(files, label_smoothing=0.0).build_losses(
        {F.TARGET_IDS: tf.constant(targets)}, {F.LOGITS: tf.constant(logits)})["loss"].numpy()
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = -np.take_along_axis(log_probs, targets[..., None], -1)[..., 0]
    np.testing.assert_allclose(plain, (nll * mask).sum(1) / mask.sum(1), rtol=1e-5, atol=1e-6)


def test_token_accuracy_counts_target_tokens_only(default_task):
    task = default_task
    targets = np.array([[7, 3, 0, 0], [5, 6, 3, 0]], np.int32)
    logits = np.zeros((2, 4, len(WORDS) + 5), np.float32)
    logits[0, 0, 7] = logits[0, 1, 4] = 1  # 1 of 2 right
    logits[1, 0, 5] = logits[1, 1, 6] = logits[1, 2, 3] = 1  # 3 of 3 right
    logits[:, 3, 0] = 1  # padding "right" but not counted
    metrics = task.build_metrics(training=False)
    task.update_metrics(metrics, {F.TARGET_IDS: tf.constant(targets)},
                        {F.LOGITS: tf.constant(logits)})
    assert metrics[0].name == "token_accuracy"
    assert float(metrics[0].result()) == pytest.approx(4 / 5, abs=1e-6)


def test_evaluation_decodes_in_graph_and_scores_bleu_against_the_references(files):
    task = make_task(files, eval_beam_size=2)
    batches = list(task.build_inputs("eval", None, is_training=False))
    step = tf.function(lambda f: task.eval_step_outputs(f, task.model(task.model_inputs(f))))
    gathered = [step(b) for b in batches]
    merged = {k: np.concatenate([g[k].numpy() for g in gathered]) for k in gathered[0]}
    assert merged[F.DECODED_IDS].shape == (4, 6) and merged[F.DECODED_IDS].dtype == np.int32
    np.testing.assert_array_equal(merged[translate_data.EXAMPLE_INDEX], np.arange(4))
    results = task.aggregate_eval(merged)
    hyps = [t.decode() for t in task.tokenizer.detokenize(merged[F.DECODED_IDS]).numpy()]
    refs = [text_like_vocabulary(t, True) for _, t in PAIRS]
    assert refs[2] == "¡corre!"  # lower-cased as the vocabulary writes it
    assert results == {"bleu": pytest.approx(corpus_bleu(hyps, refs).score, abs=1e-6),
                       "num_examples": 4.0}
    # Perfect translations, in any gather order, score 100 (references without punctuation:
    # its spacing is the detokenizer's business, tested with it).
    task._references = ["Vé", "hola", "corre corre", "el gato es grande"]
    ids = task.tokenizer.tokenize(tf.constant(task._references)).to_tensor(0, shape=[4, 6])
    perfect = task.aggregate_eval({F.DECODED_IDS: ids.numpy()[::-1],
                                   translate_data.EXAMPLE_INDEX: np.arange(4)[::-1]})
    assert perfect["bleu"] == pytest.approx(100.0, abs=1e-6)
    assert task.best_metric == "bleu" and task.best_metric_mode == "max"


def test_options_are_stored_and_read_back(files):
    task = make_task(files, beam_size=3, length_penalty=0.8, label_smoothing=0.2)
    info = task.task_info()
    assert info["family"] == "translate" and info["best_metric"] == "bleu"
    family = plugins.get_family("translate")
    assert family.options_from_info(info)["translate"] == task.translate
    model = family.head_model(task.encoder_spec.build(), info, "bert_train.json")
    assert model.max_target_length == 8 and model.vocab_size == len(WORDS) + 5


@pytest.mark.parametrize("options, message", [
    ({"label_smoothing": 1.0}, r"TranslateConfig.label_smoothing=1.0 must be in \[0, 1\)"),
    ({"max_decode_length": 9}, r"TranslateConfig.max_decode_length=9 exceeds "
                               r"max_target_length=8"),
    ({"beam_size": 0}, r"TranslateConfig.beam_size=0 must be a positive integer"),
    ({"position_encoding": "rotary"}, r"position_encoding='rotary': choose one of learned, "
                                      r"sinusoidal"),
    ({"max_target_length": 1, "max_decode_length": 1}, r"max_target_length=1 must be >= 2"),
])
def test_bad_options_are_one_line(options, message):
    config = {"max_target_length": 8, "max_decode_length": 6, **options}
    with pytest.raises(UserError, match=message):
        TranslateConfig(**config)


def test_targets_beyond_the_positions_are_refused(files):
    with pytest.raises(UserError, match=r"TranslateConfig.max_target_length=32 exceeds the "
                                        r"encoder's max_sequence_length=16 .*use "
                                        r"max_target_length <= 16"):
        make_task(files, max_target_length=32, max_decode_length=8)
    with pytest.raises(UserError, match=r"TranslateConfig: .*share_encoder_decoder"):
        make_task(files, share_encoder_decoder=True, num_decoder_layers=2)


def test_serving_translates_text_as_the_task_decodes(files):
    task = make_task(files, beam_size=2)
    module = TranslateServing(task.model, beam_size=2, length_penalty=0.6, max_decode_length=6,
                              vocab_file=files["vocab"], lower_case=True, seq_length=12)
    assert set(module.signatures()) == {SERVING_DEFAULT, ENCODE}
    texts = [s for s, _ in PAIRS]
    out = module.text_function()(input=tf.constant(texts))
    assert out["translation"].dtype == tf.string and out["translation"].shape == (4,)
    assert out["score"].dtype == tf.float32 and np.all(np.isfinite(out["score"].numpy()))
    from bert_trainer.models.generation.seq2seq import translate  # noqa: PLC0415

    inputs = translate_data.source_features(task.tokenizer, tf.constant(texts), 12)
    # The graph executor's loop, as the export's: compiling this one call with XLA would cost
    # seconds (tests/models/test_seq2seq_generation.py checks that the two agree).
    decoded = translate(task.model, inputs, beam_size=2, length_penalty=0.6, max_decode_length=6,
                        start_id=task.tokenizer.cls_id, end_id=task.tokenizer.sep_id,
                        jit_compile=False)
    np.testing.assert_array_equal(out["translation"].numpy(),
                                  task.tokenizer.detokenize(decoded[F.DECODED_IDS]).numpy())
    np.testing.assert_allclose(out["score"].numpy(), decoded[F.DECODED_SCORES].numpy(),
                               rtol=1e-5, atol=1e-5)
    answer = plugins.get_family("translate").format_answer(
        {k: v.numpy() for k, v in out.items()}, 1)
    assert set(answer) == {"translation", "score"} and isinstance(answer["translation"], str)
    assert dataclasses.is_dataclass(task.translate)


def test_warm_start_is_bert2bert_and_reported(tiny_pretrained, files):
    from bert_trainer.tasks.finetuning import spec_from_checkpoint  # noqa: PLC0415

    spec = spec_from_checkpoint(tiny_pretrained["dir"])
    td = registry.resolve_task_data("translate")
    task = registry.build_task(td, spec, config=FinetuneConfig(seq_length=32),
                               data=DataConfig(train_file=files["pairs"]),
                               translate=TranslateConfig(max_target_length=16))
    model = task.build_model()
    task.initialize(model, tiny_pretrained["dir"])
    report = task.warm_start_report
    for got, want in zip(model.encoder.weights, tiny_pretrained["encoder_weights"], strict=True):
        np.testing.assert_array_equal(got.numpy(), want)
    # The decoder's first feed-forward layer is the encoder's; its cross-attention is fresh.
    decoder, encoder_layer = model.decoder_layers[0], model.encoder.transformer_layers[0]
    np.testing.assert_array_equal(decoder.intermediate_dense.kernel.numpy(),
                                  encoder_layer.intermediate_dense.kernel.numpy())
    assert any("cross_attention" in p for p in report["initialized"])
    assert not any("cross_attention" in p for p in report["loaded"])
    assert len(report["loaded"]) + len(report["initialized"]) == len(model.weights)


def test_predict_reads_a_pair_file_by_its_header():
    from bert_trainer.export.predict_inputs import read_inputs  # noqa: PLC0415

    lines = [b"english\tspanish\n", b"Go.\tVe.\n", b"\n", b"Hi.\tHola.\n"]
    assert list(read_inputs(lines, "tsv", ("input",))) == [(2, {"input": "Go."}),
                                                           (4, {"input": "Hi."})]
    lines = [b"id\tsource\ttarget\n", "7\tRun!\t¡Corre!\n".encode()]
    assert list(read_inputs(lines, "tsv", ("input",))) == [(2, {"input": "Run!"})]


def test_model_row_outputs_give_the_full_logits_loss_and_gradients(files):
    task = make_task(files)
    rng = np.random.default_rng(3)
    targets = np.array([[7, 9, 3, 0, 0], [5, 3, 0, 0, 0], [6, 8, 10, 11, 3]], np.int32)
    features = {F.INPUT_WORD_IDS: rng.integers(1, 9, (3, 6)).astype(np.int32),
                F.INPUT_MASK: np.ones((3, 6), np.int32),
                F.INPUT_TYPE_IDS: np.zeros((3, 6), np.int32),
                F.DECODER_INPUT_IDS: rng.integers(1, 9, (3, 5)).astype(np.int32),
                F.TARGET_IDS: targets}
    variables = task.model.trainable_variables
    results = []
    for inputs in (task.model_inputs(features),  # rows: target ids given
                   {k: v for k, v in features.items() if k != F.TARGET_IDS}):  # full logits
        with tf.GradientTape() as tape:
            outputs = task.model(inputs)
            loss = task.build_losses(features, outputs)["loss"]
            total = tf.reduce_sum(loss)
        grads = tape.gradient(total, variables)
        metrics = task.build_metrics(training=False)
        task.update_metrics(metrics, features, outputs)
        results.append((loss.numpy(), grads, float(metrics[0].result())))
    (rows_loss, rows_grads, rows_acc), (full_loss, full_grads, full_acc) = results
    assert F.LOGITS not in task.model(task.model_inputs(features))
    np.testing.assert_allclose(rows_loss, full_loss, rtol=1e-5, atol=1e-6)
    assert rows_acc == full_acc
    for a, b, v in zip(rows_grads, full_grads, variables, strict=True):
        if b is None:
            assert a is None, v.path
            continue
        np.testing.assert_allclose(tf.convert_to_tensor(a).numpy(),
                                   tf.convert_to_tensor(b).numpy(), rtol=1e-4, atol=1e-6,
                                   err_msg=v.path)


def test_the_from_scratch_config_sets_the_benchmark_recipe():
    from bert_trainer import configurables  # noqa: PLC0415
    from bert_trainer.runs import gin_config  # noqa: PLC0415

    translate_config = configurables.configurable(TranslateConfig)
    gin_config.parse_gin([plugins.get_family("translate").recipe, "configs/translate/scratch.gin"])
    config = configurables.FinetuneConfig()
    optimizer = configurables.OptimizerConfig()
    assert (config.train_batch_size, config.dropout_rate, config.warmup_fraction,
            config.seq_length) == (64, 0.0, None, 64)
    assert (optimizer.learning_rate, optimizer.warmup_steps, optimizer.beta_2) == (
        pytest.approx(1e-3), 300, pytest.approx(0.98))
    assert translate_config().beam_size == 4  # the family's recipe still holds
    encoder = configurables.build_encoder(vocab_size=50)
    assert (encoder.num_layers, encoder.hidden_size) == (3, 192)
