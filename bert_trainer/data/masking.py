"""Masked-LM masking: dynamic (in `tf.data`, tensorflow-text) and static (numpy, at write time).

Both follow BERT: select ~`masked_lm_prob` of the real tokens (never `[CLS]`, `[SEP]`,
`[PAD]`), at most `max_predictions_per_seq`; of the selected, 80 % become `[MASK]`, 10 % a
random id, 10 % stay. With whole-word masking the unit of selection is a word (a piece plus
its `##` continuations) and all its pieces are predicted.

Dynamic masking runs `tf_text.mask_language_model` with two seeded subclasses of the
tensorflow-text classes: `SeededItemSelector` (a `RandomItemSelector`) and
`SeededMaskValuesChooser` (a `MaskValuesChooser`). They replace the stock stateful random ops
by stateless ones keyed by a per-batch seed, so a pipeline is reproducible for a seed even with
parallel map calls, and the selector budgets whole words in *pieces* so a row never holds
more than `max_predictions_per_seq` predictions.
"""

import dataclasses
import functools
import random

import numpy as np
import tensorflow as tf
import tensorflow_text as tf_text

from bert_trainer import features
from bert_trainer.data.tokenizer import SUFFIX_INDICATOR, Tokenizer, group_words


@dataclasses.dataclass(frozen=True, eq=False)
class MaskingVocab:
    """What masking needs to know about a vocabulary.

    Attributes:
      vocab_size: number of ids; random replacements are drawn from [0, vocab_size).
      mask_id: id of `[MASK]`.
      unselectable_ids: ids never selected (`[CLS]`, `[SEP]`, `[PAD]`).
      is_continuation: bool numpy array [vocab_size], True for `##` pieces; needed only for
        whole-word masking.
    """

    vocab_size: int
    mask_id: int
    unselectable_ids: tuple[int, ...]
    is_continuation: np.ndarray | None = None

    @functools.cached_property
    def unselectable_set(self) -> frozenset:
        return frozenset(self.unselectable_ids)

    @functools.cached_property
    def is_continuation_list(self) -> list[bool]:
        """`is_continuation` as a list (indexing it is cheaper than a numpy array's)."""
        if self.is_continuation is None:
            raise ValueError("whole-word masking needs MaskingVocab.is_continuation")
        return self.is_continuation.tolist()

    @classmethod
    def from_tokenizer(cls, tokenizer: Tokenizer) -> "MaskingVocab":
        return cls(
            vocab_size=tokenizer.vocab_size, mask_id=tokenizer.mask_id,
            unselectable_ids=(tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id),
            is_continuation=np.array([t.startswith(SUFFIX_INDICATOR) for t in tokenizer.vocab]))


def _round_half_up(x):
    return tf.floor(x + 0.5)


class SeededItemSelector(tf_text.RandomItemSelector):
    """`RandomItemSelector` with stateless randomness and a per-row budget counted in pieces.

    Each selectable item (token, or word for `[batch, (words), (pieces)]` input) gets a
    uniform score from `seed`; items are taken in score order while the number of pieces stays
    within `min(max_selections_per_batch, max(1, round(selection_rate * selectable pieces)))`.
    A word that would overflow the budget ends the selection for its row (google-research/bert
    skips it and tries shorter words, so whole-word rows here can fall a piece or two short).
    """

    def __init__(self, max_selections_per_batch, selection_rate, unselectable_ids, seed):
        """Args:
          max_selections_per_batch: most pieces selected per row (max_predictions_per_seq).
          selection_rate: fraction of selectable pieces to select.
          unselectable_ids: list of ids never selected.
          seed: int tensor [2], the stateless random seed.
        """
        super().__init__(max_selections_per_batch, selection_rate, list(unselectable_ids))
        self.seed = seed

    def get_selection_mask(self, input_ids, axis):
        """Returns bool RaggedTensor [batch, (items)]: the selected items."""
        selectable = self.get_selectable(input_ids, axis)  # [batch, (items)]
        if input_ids.ragged_rank > 1:  # Items are words; their size is their piece count.
            sizes = input_ids.row_lengths(axis=2)
        else:
            sizes = tf.ones_like(selectable, tf.int64)
        selectable_dense = selectable.to_tensor(False)  # (batch, items)
        sizes = sizes.to_tensor(0) * tf.cast(selectable_dense, tf.int64)
        scores = tf.random.stateless_uniform(tf.shape(selectable_dense), self.seed)
        scores = tf.where(selectable_dense, scores, -1.0)
        order = tf.argsort(scores, axis=1, direction="DESCENDING", stable=True)
        sorted_sizes = tf.gather(sizes, order, batch_dims=1)
        total = tf.reduce_sum(sizes, axis=1, keepdims=True)  # (batch, 1)
        budget = tf.maximum(1.0, _round_half_up(
            tf.cast(total, tf.float32) * self.selection_rate))
        budget = tf.minimum(tf.cast(budget, tf.int64), self.max_selections_per_batch)
        chosen_sorted = (tf.cumsum(sorted_sizes, axis=1) <= budget) & (sorted_sizes > 0)
        chosen = tf.gather(chosen_sorted, tf.argsort(order, axis=1), batch_dims=1)
        return tf.RaggedTensor.from_tensor(chosen, lengths=selectable.row_lengths())


class SeededMaskValuesChooser(tf_text.MaskValuesChooser):
    """`MaskValuesChooser` (80 % `[MASK]`, 10 % random id, 10 % kept) with a stateless seed."""

    def __init__(self, vocab_size, mask_token, seed, mask_token_rate=0.8,
                 random_token_rate=0.1):
        super().__init__(vocab_size, mask_token, mask_token_rate, random_token_rate)
        self.seed = seed

    def get_mask_values(self, masked_lm_ids):
        """Args: masked_lm_ids: RaggedTensor [batch, (masked)]. Returns: the new values."""
        ids = masked_lm_ids.flat_values
        seed_kind, seed_token = (tf.random.experimental.stateless_fold_in(self.seed, i)
                                 for i in (1, 2))
        u = tf.random.stateless_uniform(tf.shape(ids), seed_kind)
        random_ids = tf.random.stateless_uniform(
            tf.shape(ids), seed_token, minval=0, maxval=self.vocab_size, dtype=ids.dtype)
        values = tf.where(u < self._mask_token_rate, tf.cast(self.mask_token, ids.dtype),
                          tf.where(u < self._mask_token_rate + self.random_token_rate,
                                   random_ids, ids))
        return masked_lm_ids.with_flat_values(values)


def mask_batch(batch: dict, seed, *, vocab: MaskingVocab, max_predictions_per_seq: int,
               masked_lm_prob: float = 0.15, whole_word: bool = False,
               mask_token_rate: float = 0.8, random_token_rate: float = 0.1) -> dict:
    """Dynamically masks a batch of packed sequences.

    Args:
      batch: dict with features.INPUT_WORD_IDS and INPUT_MASK, int [batch, seq]; other keys
        pass through.
      seed: int tensor [2]; the same seed gives the same masks.
      vocab: see `MaskingVocab`.
      max_predictions_per_seq: P, the most masked positions per row.
      masked_lm_prob: fraction of real tokens to predict.
      whole_word: select whole words (needs `vocab.is_continuation`).
      mask_token_rate, random_token_rate: of the selected, fraction set to [MASK] / random.

    Returns:
      `batch` with INPUT_WORD_IDS masked (int32 [batch, seq]) and MASKED_LM_POSITIONS int32,
      MASKED_LM_IDS int32, MASKED_LM_WEIGHTS float32 (0 on padding predictions), each
      [batch, P]; positions are sorted ascending.
    """
    word_ids = tf.cast(batch[features.INPUT_WORD_IDS], tf.int32)  # (batch, seq)
    lengths = tf.reduce_sum(tf.cast(batch[features.INPUT_MASK], tf.int32), axis=1)
    tokens = tf.RaggedTensor.from_tensor(word_ids, lengths=lengths)  # (batch, (tokens))
    if whole_word:
        if vocab.is_continuation is None:
            raise ValueError("whole-word masking needs MaskingVocab.is_continuation")
        tokens = group_words(tokens, tf.constant(vocab.is_continuation))
    seed = tf.cast(seed, tf.int64)
    selector = SeededItemSelector(max_predictions_per_seq, masked_lm_prob,
                                  vocab.unselectable_ids, seed)
    chooser = SeededMaskValuesChooser(
        vocab.vocab_size, vocab.mask_id, tf.random.experimental.stateless_fold_in(seed, 7),
        mask_token_rate, random_token_rate)
    new_ids, positions, labels = tf_text.mask_language_model(tokens, selector, chooser, axis=1)
    new_dense = new_ids.to_tensor(shape=tf.shape(word_ids))
    shape = [tf.shape(word_ids)[0], max_predictions_per_seq]
    out = dict(batch)
    out[features.INPUT_WORD_IDS] = tf.where(tf.sequence_mask(lengths, tf.shape(word_ids)[1]),
                                            new_dense, word_ids)
    out[features.MASKED_LM_POSITIONS] = tf.cast(positions.to_tensor(0, shape=shape), tf.int32)
    out[features.MASKED_LM_IDS] = tf.cast(labels.to_tensor(0, shape=shape), tf.int32)
    out[features.MASKED_LM_WEIGHTS] = tf.ones_like(positions, tf.float32).to_tensor(
        0.0, shape=shape)
    return out


def static_mask(ids: np.ndarray, rng: random.Random, *, vocab: MaskingVocab,
                max_predictions_per_seq: int, masked_lm_prob: float = 0.15,
                whole_word: bool = False):
    """google-research/bert's `create_masked_lm_predictions`, on ids (for --static_masking).

    Args:
      ids: int array [tokens]: `[CLS] A [SEP] B [SEP]`, unpadded.
      rng: the writer's `random.Random`.
      vocab, max_predictions_per_seq, masked_lm_prob, whole_word: as in `mask_batch`.

    Returns:
      (masked_ids [tokens], positions [n], labels [n]) int arrays, n <= P, positions sorted.
    """
    masked, positions, labels = static_mask_list(
        ids.tolist(), rng, vocab=vocab, max_predictions_per_seq=max_predictions_per_seq,
        masked_lm_prob=masked_lm_prob, whole_word=whole_word)
    return (np.array(masked, dtype=ids.dtype), np.array(positions, dtype=np.int64),
            np.array(labels, dtype=ids.dtype))


def static_mask_list(ids: list[int], rng: random.Random, *, vocab: MaskingVocab,
                     max_predictions_per_seq: int, masked_lm_prob: float = 0.15,
                     whole_word: bool = False) -> tuple[list[int], list[int], list[int]]:
    """`static_mask` on a list of ids: (masked ids, sorted positions, their original ids).

    `rng` is consumed in the same order as google-research/bert.
    """
    special = vocab.unselectable_set
    num_to_predict = min(max_predictions_per_seq,
                         max(1, int(round(len(ids) * masked_lm_prob))))
    shuffle = _shuffle if type(rng) is random.Random else _random_shuffle
    if whole_word:
        is_continuation = vocab.is_continuation_list
        candidates = []  # Lists of positions, one per word.
        for i, token in enumerate(ids):
            if token in special:
                continue
            if candidates and is_continuation[token]:
                candidates[-1].append(i)
            else:
                candidates.append([i])
        shuffle(candidates, rng)
        chosen = []
        for group in candidates:
            if len(chosen) >= num_to_predict:
                break
            if len(chosen) + len(group) > num_to_predict:
                continue  # As google-research/bert: skip a word that would overflow.
            chosen.extend(group)
    else:  # Every candidate is one position: the first ones of the shuffle, none skipped.
        candidates = [i for i, token in enumerate(ids) if token not in special]
        shuffle(candidates, rng)
        chosen = candidates[:num_to_predict]
    masked = list(ids)
    for i in chosen:
        if rng.random() < 0.8:
            masked[i] = vocab.mask_id
        elif rng.random() < 0.5:
            pass  # 10 %: keep the original token.
        else:
            masked[i] = rng.randint(0, vocab.vocab_size - 1)
    positions = sorted(chosen)
    return masked, positions, [ids[i] for i in positions]


def _random_shuffle(x: list, rng: random.Random) -> None:
    rng.shuffle(x)


def _shuffle_inline(x: list, rng: random.Random) -> None:
    """`rng.shuffle(x)` with the same draws, without two Python calls per element.

    CPython's `Random.shuffle` swaps x[i] with x[randbelow(i + 1)] for i from the end, and
    `randbelow(n)` draws `getrandbits(n.bit_length())` until it is below n.
    """
    getrandbits = rng.getrandbits
    for i in range(len(x) - 1, 0, -1):
        n = i + 1
        k = n.bit_length()
        j = getrandbits(k)
        while j >= n:
            j = getrandbits(k)
        x[i], x[j] = x[j], x[i]


def _same_draws_as_random_shuffle() -> bool:
    """Whether `_shuffle_inline` gives what this Python's `Random.shuffle` gives."""
    for seed, size in ((0, 300), (1, 2), (2, 1000), (3, 129)):
        a, b = list(range(size)), list(range(size))
        ra, rb = random.Random(seed), random.Random(seed)
        ra.shuffle(a)
        _shuffle_inline(b, rb)
        if a != b or ra.random() != rb.random():
            return False
    return True


# The inline shuffle where it draws as `Random.shuffle` does (checked once, on import).
_shuffle = _shuffle_inline if _same_draws_as_random_shuffle() else _random_shuffle
