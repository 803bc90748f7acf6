"""The course's GRU translators as translate architectures: the model's maths (its cached
decoding step against teacher forcing, the encoder's last state on padded rows), its decoding
through the shared search loops, and one run through finetune → evaluate → export → predict."""

import json

import gin
import numpy as np
import pytest
import tensorflow as tf
from conftest import REPO, word_level_vocab
from translate_testing import SPA_ENG, run_cli, take

from bert_trainer import features as F
from bert_trainer.encoders import GruEncoder, build_encoder
from bert_trainer.errors import UserError
from bert_trainer.models import GruTranslator
from bert_trainer.models import seq2seq_transformer as s2s
from bert_trainer.models.generation.seq2seq import translate
from bert_trainer.tasks.translate.task import TranslateConfig, build_model

VOCAB, WIDTH, UNITS = 40, 8, 12
# float32 maths in another order (a loop of cell steps against the layer's scan): last bits
TOLERANCE = dict(rtol=1e-5, atol=1e-5)


def _model(attention: bool, seed: int = 0) -> GruTranslator:
    tf.keras.utils.set_random_seed(seed)
    encoder = build_encoder(kind="gru", vocab_size=VOCAB, embedding_width=WIDTH,
                            hidden_size=UNITS, max_sequence_length=16)
    return build_model(encoder, TranslateConfig(architecture="gru_attention" if attention
                                                else "gru", max_target_length=10))


def _batch():
    """Two sources (the second right-padded) and their teacher-forcing targets."""
    ids = np.array([[1, 5, 6, 7, 8, 2], [1, 9, 3, 2, 0, 0]], np.int32)
    decoder = np.array([[1, 11, 12, 13, 14], [1, 15, 16, 0, 0]], np.int32)
    targets = np.array([[11, 12, 13, 14, 2], [15, 16, 2, 0, 0]], np.int32)
    return {F.INPUT_WORD_IDS: ids, F.INPUT_MASK: (ids > 0).astype(np.int32),
            F.INPUT_TYPE_IDS: np.zeros_like(ids), F.DECODER_INPUT_IDS: decoder,
            F.TARGET_IDS: targets}


@pytest.fixture(scope="module", params=[False, True], ids=["gru", "gru_attention"])
def model(request):
    model = _model(request.param)
    # Never [PAD] (id 0), as after training: a decoder input of 0 is padding to `call`.
    bias = model.output_projection.bias
    bias.assign(np.where(np.arange(VOCAB) == 0, -1e4, bias.numpy()))
    return model


def test_the_encoders_last_state_is_the_state_after_the_last_real_token(model):
    batch = _batch()
    states, _ = model.encode(batch)
    alone = {F.INPUT_WORD_IDS: batch[F.INPUT_WORD_IDS][1:, :4],
             F.INPUT_MASK: batch[F.INPUT_MASK][1:, :4]}
    unpadded, _ = model.encode(alone)
    np.testing.assert_allclose(states[1, -1], unpadded[0, -1], **TOLERANCE)
    np.testing.assert_allclose(states[1, 3], states[1, -1], **TOLERANCE)  # carried forward
    pooled = model.encoder(batch)[F.POOLED_OUTPUT]
    assert pooled.shape == (2, UNITS)
    np.testing.assert_allclose(pooled, states[:, -1], **TOLERANCE)


def test_each_cached_step_equals_teacher_forcing(model):
    batch = _batch()
    full = {k: v for k, v in batch.items() if k != F.TARGET_IDS}
    logits = model(full)[F.LOGITS].numpy()
    assert logits.shape == (2, 5, VOCAB) and logits.dtype == np.float32
    states, mask = model.encode(batch)
    cache = model.init_cache(2, 5, encoder_output=states)
    assert set(cache) == ({"state", "cross_key"} if model.use_attention else {"state"})
    for t in range(5):
        step, cache = model.decode_step(batch[F.DECODER_INPUT_IDS][:, t], t, cache, None, mask)
        real = batch[F.DECODER_INPUT_IDS][:, t] > 0  # a padded input's step is not teacher forced
        np.testing.assert_allclose(step.numpy()[real], logits[real, t], **TOLERANCE)
    # Given the targets, the real target tokens' rows alone, in row-major order.
    rows = model(batch)
    where = np.argwhere(batch[F.TARGET_IDS] > 0)
    np.testing.assert_allclose(rows[s2s.TARGET_LOGITS], logits[where[:, 0], where[:, 1]],
                               **TOLERANCE)
    assert rows[s2s.TARGET_LABELS].numpy().tolist() == batch[F.TARGET_IDS][
        where[:, 0], where[:, 1]].tolist()
    assert rows[s2s.TARGET_ROWS].numpy().tolist() == where[:, 0].tolist()


def test_search_loops_decode_the_gru_as_the_transformer(model):
    inputs = {k: _batch()[k] for k in F.ENCODER_INPUTS}
    settings = dict(length_penalty=0.6, max_decode_length=8, start_id=1, end_id=2)
    greedy = translate(model, inputs, beam_size=1, jit_compile=False, **settings)
    uncached = translate(model, inputs, beam_size=1, use_cache=False, **settings)
    compiled = translate(model, inputs, beam_size=1, jit_compile=True, **settings)
    ids = greedy[F.DECODED_IDS].numpy()
    assert ids.shape == (2, 8)
    assert ids.tolist() == uncached[F.DECODED_IDS].numpy().tolist()
    assert ids.tolist() == compiled[F.DECODED_IDS].numpy().tolist()
    np.testing.assert_allclose(greedy[F.DECODED_SCORES], uncached[F.DECODED_SCORES], **TOLERANCE)
    # By hand: the argmax of each cached step, fed back.
    states, mask = model.encode(inputs)
    cache, token = model.init_cache(2, 8, encoder_output=states), np.ones(2, np.int32)
    for t in range(3):
        logits, cache = model.decode_step(token, t, cache, None, mask)
        token = np.argmax(logits.numpy(), axis=-1).astype(np.int32)
        assert token.tolist() == ids[:, t].tolist()
    beams = translate(model, inputs, beam_size=3, jit_compile=False, **settings)
    assert beams[F.DECODED_IDS].shape == (2, 8)
    # Beam search keeps the best of several hypotheses: never worse than greedy's.
    assert np.all(beams[F.DECODED_SCORES].numpy() >= greedy[F.DECODED_SCORES].numpy() - 1e-4)


def test_config_round_trip_and_arguments():
    model = _model(attention=True)
    encoder = GruEncoder.from_config(model.encoder.get_config())
    assert encoder.get_config() == model.encoder.get_config()
    assert model.encoder.get_config()["embedding_width"] == WIDTH
    again = GruTranslator.from_config(model.get_config())
    assert again.use_attention and again.max_target_length == 10
    with pytest.raises(UserError, match="GruEncoder takes no argument 'num_layers'"):
        build_encoder(kind="gru", vocab_size=VOCAB, num_layers=2)
    with pytest.raises(ValueError, match="hidden_size must be a positive int"):
        GruEncoder(vocab_size=VOCAB, hidden_size=0)


def test_architectures_refuse_an_encoder_of_the_other_kind():
    gru = GruEncoder(vocab_size=VOCAB, embedding_width=WIDTH, hidden_size=UNITS,
                     max_sequence_length=16)
    with pytest.raises(UserError, match="translates with TranslateConfig.architecture 'gru' or "
                                        "'gru_attention', not 'transformer'"):
        build_model(gru, TranslateConfig(max_target_length=10))
    bert = build_encoder(vocab_size=VOCAB, hidden_size=16, num_layers=1, num_attention_heads=2,
                         inner_dim=32, max_sequence_length=16)
    with pytest.raises(UserError, match=r"architecture='gru' is the course's GRU translator.*"
                                        r"not a BertEncoder"):
        build_model(bert, TranslateConfig(architecture="gru", max_target_length=10))
    with pytest.raises(UserError, match="architecture='lstm': choose one of transformer, gru, "
                                        "gru_attention"):
        TranslateConfig(architecture="lstm")


@pytest.mark.slow
def test_gru_attention_finetune_evaluate_export_predict(tmp_path, capsys, minilm_dir):
    if not (SPA_ENG / "train.tsv").is_file():
        pytest.skip(f"{SPA_ENG} is absent (it holds the real test data)")
    train, dev = tmp_path / "train.tsv", tmp_path / "dev.tsv"
    take(SPA_ENG / "train.tsv", train, 200)
    dev_pairs = take(SPA_ENG / "dev.tsv", dev, 12)
    vocab = word_level_vocab([train, dev], 800)
    vocab_file = tmp_path / "vocab.txt"
    vocab_file.write_text("".join(t + "\n" for t in vocab), encoding="utf-8")
    model_dir, export = tmp_path / "run", tmp_path / "export"
    small = ["--gin_param=build_encoder.embedding_width = 16",
             "--gin_param=build_encoder.hidden_size = 16",
             "--gin_param=TranslateConfig.max_target_length = 16",
             "--gin_param=TranslateConfig.max_decode_length = 12",
             "--gin_param=TranslateConfig.eval_beam_size = 2"]
    gin_file = f"--gin_file={REPO / 'configs' / 'translate' / 'gru_attention.gin'}"
    common = [f"--train_file={train}", f"--eval_file={dev}", f"--vocab_file={vocab_file}",
              "--lower_case=true", gin_file, *small, "--seq_length=24", "--batch_size=16"]

    proc = run_cli(capsys, "finetune", "--task=translate", *common, "--train_steps=6",
                   f"--model_dir={model_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((model_dir / "eval_results.json").read_text())
    assert results["step"] == 6 and results["metrics"]["num_examples"] == 12
    assert 0 <= results["metrics"]["bleu"] <= 100 and 0 < results["metrics"]["loss"] < 20
    info = json.loads((model_dir / "bert_train.json").read_text())
    assert info["encoder"]["class_name"] == "GruEncoder"
    assert info["encoder"]["config"]["vocab_size"] == len(vocab)
    assert info["encoder"]["config"]["hidden_size"] == 16
    translate_info = info["task"]["translate"]
    assert translate_info["architecture"] == "gru_attention"
    assert translate_info["label_smoothing"] == 0.0  # gru.gin's, over the family recipe's 0.1

    proc = run_cli(capsys, "export", f"--model_dir={model_dir}", f"--output={export}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    outputs = next(line.split(" -> ")[1].split(", ") for line in proc.stdout.splitlines()
                   if line.strip().startswith("serving_default(input) -> "))
    # The translation and its score, and what every text signature returns: the
    # truncation flag and the real and padding token counts of the rows it ran as.
    assert {"score", "translation", "truncated", "input_tokens",
            "padding_tokens"} <= set(outputs), outputs
    sources = [pair.split("\t")[0] for pair in dev_pairs[:4]]
    text_in = tmp_path / "in.txt"
    text_in.write_text("\n".join(sources) + "\n", encoding="utf-8")
    answers = {}
    for name, source in (("saved", f"--saved_model={export}"), ("dir", f"--model_dir={model_dir}")):
        out = tmp_path / f"{name}.jsonl"
        proc = run_cli(capsys, "predict", source, f"--input={text_in}", f"--output={out}")
        assert proc.returncode == 0, proc.stderr[-3000:]
        answers[name] = [json.loads(line) for line in out.read_text().splitlines()]
    assert [a["input"] for a in answers["saved"]] == sources
    assert all(isinstance(a["translation"], str) for a in answers["saved"])
    # The export (graph loop) and --model_dir (the XLA-compiled loop) translate alike.
    assert [a["translation"] for a in answers["dir"]] == [
        a["translation"] for a in answers["saved"]]
    assert [a["score"] for a in answers["dir"]] == pytest.approx(
        [a["score"] for a in answers["saved"]], abs=1e-4)

    # A warm start is BERT2BERT's: refused with one line before anything is written.
    refused = tmp_path / "refused"
    proc = run_cli(capsys, "finetune", "--task=translate", *common, "--train_steps=2",
                   f"--init_checkpoint={minilm_dir}", f"--model_dir={refused}")
    assert proc.returncode == 2, proc.stderr[-3000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert "architecture='gru_attention'" in line and "not a BertEncoder" in line, line
    assert not refused.exists()
    gin.clear_config()
