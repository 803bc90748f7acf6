"""Masking: rates, 80/10/10 split, special tokens, whole words, determinism, static masking."""

import random

import numpy as np
import pytest
import tensorflow as tf
from conftest import SHARED

from bert_trainer import features
from bert_trainer.data import masking

P = 20


@pytest.fixture(scope="module")
def batch(tokenizer):
    """256 real text pairs from Emma (3 lines a segment), packed to 128, padding on short ones."""
    corpus = SHARED / "data" / "corpus"
    if not corpus.is_dir():
        pytest.skip(f"{corpus} is absent (CI provides it)")
    text = (corpus / "gutenberg" / "austen-emma.txt").read_text(encoding="utf-8")[20_000:220_000]
    lines = [line for line in text.splitlines() if len(line.split()) > 3][:1536]
    segments = [" ".join(lines[i:i + 3]) for i in range(0, len(lines), 3)]
    a, b = tokenizer.tokenize(segments[0::2]), tokenizer.tokenize(segments[1::2])
    return tokenizer.pack([a, b], seq_length=128)


def _mask(batch, tokenizer, seed=(3, 4), whole_word=False):
    vocab = masking.MaskingVocab.from_tokenizer(tokenizer)
    return masking.mask_batch(batch, tf.constant(seed), vocab=vocab, max_predictions_per_seq=P,
                              whole_word=whole_word)


def _real_tokens(batch, tokenizer):
    ids = batch[features.INPUT_WORD_IDS].numpy()
    return (batch[features.INPUT_MASK].numpy() == 1) & ~np.isin(
        ids, [tokenizer.cls_id, tokenizer.sep_id])


@pytest.mark.parametrize("whole_word", [False, True])
def test_shapes_dtypes_and_labels(batch, tokenizer, whole_word):
    out = _mask(batch, tokenizer, whole_word=whole_word)
    b = batch[features.INPUT_WORD_IDS].shape[0]
    assert out[features.INPUT_WORD_IDS].shape == (b, 128)
    for name, dtype in [(features.MASKED_LM_POSITIONS, tf.int32),
                        (features.MASKED_LM_IDS, tf.int32),
                        (features.MASKED_LM_WEIGHTS, tf.float32)]:
        assert out[name].shape == (b, P) and out[name].dtype == dtype, name
    original = batch[features.INPUT_WORD_IDS].numpy()
    pos, ids = out[features.MASKED_LM_POSITIONS].numpy(), out[features.MASKED_LM_IDS].numpy()
    weights = out[features.MASKED_LM_WEIGHTS].numpy()
    real = weights > 0
    # Labels are the original ids; padding predictions have weight 0, id 0, position 0.
    np.testing.assert_array_equal(np.take_along_axis(original, pos, 1)[real], ids[real])
    assert (ids[~real] == 0).all() and (pos[~real] == 0).all()
    # Real predictions come first and their positions ascend.
    assert (np.diff(weights, axis=1) <= 0).all()
    assert all((np.diff(p[r]) > 0).all() for p, r in zip(pos, real, strict=True))
    # Tokens that were not selected are untouched.
    selected = np.zeros_like(original, bool)
    for row, (p, r) in enumerate(zip(pos, real, strict=True)):
        selected[row, p[r]] = True
    new = out[features.INPUT_WORD_IDS].numpy()
    np.testing.assert_array_equal(new[~selected], original[~selected])


@pytest.mark.parametrize("whole_word", [False, True])
def test_rates_and_special_tokens(batch, tokenizer, whole_word):
    out = _mask(batch, tokenizer, whole_word=whole_word)
    real_tokens = _real_tokens(batch, tokenizer)
    weights = out[features.MASKED_LM_WEIGHTS].numpy()
    pos = out[features.MASKED_LM_POSITIONS].numpy()
    # Never [CLS], [SEP] or [PAD]: every selected position is a real token.
    selected_is_real = np.take_along_axis(real_tokens, pos, 1)[weights > 0]
    assert selected_is_real.all()
    # ~15 % of real tokens; P=20 caps rows with > 133 real tokens, none here at length 128.
    fraction = weights.sum() / real_tokens.sum()
    low = 0.14 if whole_word else 0.148  # Whole words stop at the first word that overflows.
    assert low <= fraction <= 0.153, fraction
    original = batch[features.INPUT_WORD_IDS].numpy()
    new = np.take_along_axis(out[features.INPUT_WORD_IDS].numpy(), pos, 1)[weights > 0]
    labels = np.take_along_axis(original, pos, 1)[weights > 0]
    n = len(new)
    as_mask = (new == tokenizer.mask_id).mean()
    kept = (new == labels).mean()
    assert n > 3000
    assert abs(as_mask - 0.8) < 0.03, as_mask
    assert abs(kept - 0.1) < 0.025, kept  # A random id equal to the label is ~0 likely.
    assert abs(1 - as_mask - kept - 0.1) < 0.025


def test_whole_word_masks_every_piece_of_a_selected_word(batch, tokenizer):
    out = _mask(batch, tokenizer, whole_word=True)
    original = batch[features.INPUT_WORD_IDS].numpy()
    is_cont = tokenizer.is_continuation.numpy()
    pos, weights = out[features.MASKED_LM_POSITIONS].numpy(), out[features.MASKED_LM_WEIGHTS]
    words_checked = 0
    for row in range(original.shape[0]):
        chosen = set(pos[row][weights.numpy()[row] > 0].tolist())
        for p in chosen:
            # The piece before a selected continuation piece is selected too, and so is the
            # continuation after a selected piece.
            if is_cont[original[row, p]]:
                assert p - 1 in chosen
            if p + 1 < original.shape[1] and is_cont[original[row, p + 1]]:
                assert p + 1 in chosen
                words_checked += 1
    assert words_checked > 50  # Multi-piece words really were exercised.


def test_same_seed_same_masks_other_seed_differs(batch, tokenizer):
    a = _mask(batch, tokenizer, seed=(1, 2))
    b = _mask(batch, tokenizer, seed=(1, 2))
    c = _mask(batch, tokenizer, seed=(1, 3))
    for name in (features.INPUT_WORD_IDS, features.MASKED_LM_POSITIONS):
        np.testing.assert_array_equal(a[name].numpy(), b[name].numpy())
    pos_a, pos_c = (x[features.MASKED_LM_POSITIONS].numpy() for x in (a, c))
    differ = [set(ra) != set(rc) for ra, rc in zip(pos_a, pos_c, strict=True)]
    assert np.mean(differ) > 0.95


def test_short_rows_get_at_least_one_prediction_and_cap(tokenizer):
    ids = tf.constant([[101, 7592, 102, 0, 0, 0], [101, 102, 0, 0, 0, 0]])
    mask = tf.cast(ids > 0, tf.int32)
    out = masking.mask_batch({features.INPUT_WORD_IDS: ids, features.INPUT_MASK: mask},
                             tf.constant([0, 0]), max_predictions_per_seq=2,
                             vocab=masking.MaskingVocab.from_tokenizer(tokenizer))
    # One real token -> max(1, round(0.15)) = 1 prediction; a row of only specials -> none.
    assert out[features.MASKED_LM_WEIGHTS].numpy().tolist() == [[1.0, 0.0], [0.0, 0.0]]
    assert out[features.MASKED_LM_POSITIONS].numpy()[0, 0] == 1
    assert out[features.MASKED_LM_IDS].numpy()[0, 0] == 7592


def test_static_mask_follows_google_research_bert(tokenizer):
    vocab = masking.MaskingVocab.from_tokenizer(tokenizer)
    rng = random.Random(0)
    pieces = tokenizer.tokenize(["unflinchingly bleak and desperate journey " * 6]).to_list()[0]
    ids = np.array([tokenizer.cls_id] + pieces + [tokenizer.sep_id])
    counts = {"mask": 0, "kept": 0, "n": 0}
    for _ in range(300):
        masked, positions, labels = masking.static_mask(
            ids, rng, vocab=vocab, max_predictions_per_seq=P, whole_word=True)
        # round(len(tokens) * 0.15) as google-research/bert, [CLS]/[SEP] included in the count.
        assert len(positions) <= round(len(ids) * 0.15)
        assert 0 not in positions and len(ids) - 1 not in positions
        np.testing.assert_array_equal(labels, ids[positions])
        chosen = set(positions.tolist())
        for p in chosen:  # Whole words only.
            if vocab.is_continuation[ids[p]]:
                assert p - 1 in chosen
        counts["mask"] += int((masked[positions] == tokenizer.mask_id).sum())
        counts["kept"] += int((masked[positions] == labels).sum())
        counts["n"] += len(positions)
    assert abs(counts["mask"] / counts["n"] - 0.8) < 0.03
    assert abs(counts["kept"] / counts["n"] - 0.1) < 0.03


def _google_static_mask(ids, rng, vocab, max_predictions_per_seq, masked_lm_prob, whole_word):
    """google-research/bert's create_masked_lm_predictions on ids, written as it is there."""
    cand_indexes = []
    for i, token in enumerate(ids):
        if token in vocab.unselectable_ids:
            continue
        if whole_word and cand_indexes and vocab.is_continuation[token]:
            cand_indexes[-1].append(i)
        else:
            cand_indexes.append([i])
    rng.shuffle(cand_indexes)
    output = list(ids)
    num_to_predict = min(max_predictions_per_seq, max(1, int(round(len(ids) * masked_lm_prob))))
    masked = []
    for index_set in cand_indexes:
        if len(masked) >= num_to_predict:
            break
        if len(masked) + len(index_set) > num_to_predict:
            continue
        for index in index_set:
            if rng.random() < 0.8:
                output[index] = vocab.mask_id
            elif rng.random() < 0.5:
                pass
            else:
                output[index] = rng.randint(0, vocab.vocab_size - 1)
            masked.append(index)
    positions = sorted(masked)
    return output, positions, [ids[p] for p in positions]


@pytest.mark.parametrize("whole_word", [False, True])
def test_static_mask_draws_exactly_as_google_research_bert(tokenizer, whole_word):
    """The fast static masking makes google-research/bert's masks from the same generator."""
    assert masking._shuffle is masking._shuffle_inline  # The fast path runs on this Python.
    vocab = masking.MaskingVocab.from_tokenizer(tokenizer)
    rng, mine, google = random.Random(1), random.Random(2), random.Random(2)
    for _ in range(400):
        n = rng.randint(3, 200)
        ids = [tokenizer.cls_id] + [rng.randrange(999, vocab.vocab_size) for _ in range(n)]
        ids[rng.randrange(1, n)] = tokenizer.sep_id
        ids.append(tokenizer.sep_id)
        p, prob = rng.choice([1, 5, 20, 80]), rng.choice([0.15, 0.3])
        got = masking.static_mask_list(ids, mine, vocab=vocab, max_predictions_per_seq=p,
                                       masked_lm_prob=prob, whole_word=whole_word)
        assert got == _google_static_mask(ids, google, vocab, p, prob, whole_word)
    assert mine.random() == google.random()  # The same number of draws.


def test_inline_shuffle_draws_as_random_shuffle():
    for size in range(0, 300, 7):
        for seed in range(3):
            a, b = list(range(size)), list(range(size))
            ra, rb = random.Random(seed), random.Random(seed)
            ra.shuffle(a)
            masking._shuffle_inline(b, rb)
            assert a == b and ra.getstate() == rb.getstate()
