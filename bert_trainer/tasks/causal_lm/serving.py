"""Generation on raw text: prompt strings in, generated strings, ids and scores out.

A prompt is tokenized in the graph with the model directory's vocabulary and fed as
`[SEP] prompt pieces` (the separator that starts every document in the training stream),
generated with the key/value cache (`generation.causal.generate`) until the model emits
`[SEP]` or `max_new_tokens` pieces, and detokenized (`Tokenizer.detokenize`), so an export
runs with tensorflow and tensorflow-text only.

Signatures (b prompts):

  serving_default(prompt string [b])            greedy
  generate(prompt string [b], max_new_tokens int32 [], temperature float32 [],
           top_k int32 [], top_p float32 [], seed int32 [])
                                                 greedy at temperature 0, else sampled;
                                                 max_new_tokens <= 0: the export's bound
      -> generated_text string [b], generated_ids int32 [b, max_new_tokens] (0 after the
         end), generated_length int32 [b], score float32 [b] (the model's log-probability
         of the generated pieces), truncated bool [b] (the prompt lost its first pieces),
         input_tokens, padding_tokens int32 [b] (the prompts' `serving.padding_counts`:
         padded to the batch's longest)
  prompt_length(prompt string [b])
      -> prompt_length int32 [b] (pieces, [SEP] included, before any cut),
         max_prompt_length int32 [], max_new_tokens int32 []

The module's `max_new_tokens` is fixed when it is built (the cache has static shapes); a call
may ask for fewer (`generate`'s max_new_tokens, clipped to the bound: the loop stops there).
A prompt keeps its last `seq_length - n - 1` pieces for n new ones (at the bound:
`max_prompt_length - 1`), the text nearest the continuation, and `truncated` bool [b] says
so (`predict` marks the record); `bert-train generate` refuses a longer prompt instead.
"""

import tensorflow as tf

from bert_trainer.models.generation.causal import generate
from bert_trainer.serving import SERVING_DEFAULT, TaskServing, padding_counts, text_input_spec
from bert_trainer.tasks.family import TRUNCATED

PROMPT = "prompt"
GENERATED_TEXT, GENERATED_IDS = "generated_text", "generated_ids"
GENERATED_LENGTH, SCORE = "generated_length", "score"
PROMPT_LENGTH, MAX_PROMPT_LENGTH, MAX_NEW_TOKENS = (
    "prompt_length", "max_prompt_length", "max_new_tokens")
GENERATE, PROMPT_LENGTHS = "generate", "prompt_length"  # signature names
SETTINGS = ("temperature", "top_k", "top_p", "seed")
DEFAULT_MAX_NEW_TOKENS = 64


def default_max_new_tokens(seq_length: int) -> int:
    """The export's bound when nothing says otherwise: 64, at most half the positions."""
    return max(1, min(DEFAULT_MAX_NEW_TOKENS, seq_length // 2))


class CausalLMServing(TaskServing):
    """A `CausalLM` with its tokenizer (see the module docstring for the signatures).

    Args:
      model: a `CausalLM`.
      max_new_tokens: the most pieces generated per prompt (static); below `seq_length`.
      **kwargs: `ServingModule` arguments: vocab_file, lower_case, and seq_length, the
        positions a prompt and its continuation share (at most the model's
        max_sequence_length).

    Attributes:
      max_new_tokens: as given; may be changed until a signature is first traced.
      jit_compile: run the decoding loop compiled with XLA (`generate`'s jit_compile), which
        on a CPU about doubles the tokens/s. False by default: an export stays servable by
        any TensorFlow runtime, XLA's just-in-time compiler or not; `bert-train generate
        --model_dir` sets it before the first trace.
    """

    family = "causal_lm"
    jit_compile = False

    def __init__(self, model, *, max_new_tokens: int | None = None, **kwargs):
        super().__init__(model, **kwargs)
        self.max_new_tokens = int(max_new_tokens or default_max_new_tokens(self.seq_length))

    @property
    def max_prompt_length(self) -> int:
        """The most prompt pieces ([SEP] included) that leave room for `max_new_tokens`."""
        return self.seq_length - self.max_new_tokens

    def _specs(self) -> dict:
        # No encode / serving_ids: a causal LM has no pooled output nor segment inputs.
        settings = [tf.TensorSpec([], tf.int32, name="max_new_tokens"),
                    tf.TensorSpec([], tf.float32, name="temperature"),
                    tf.TensorSpec([], tf.int32, name="top_k"),
                    tf.TensorSpec([], tf.float32, name="top_p"),
                    tf.TensorSpec([], tf.int32, name="seed")]
        return {SERVING_DEFAULT: (self._greedy, [text_input_spec(PROMPT)]),
                GENERATE: (self._generate, [text_input_spec(PROMPT), *settings]),
                PROMPT_LENGTHS: (self._prompt_length, [text_input_spec(PROMPT)])}

    def _prompt_pieces(self, prompt) -> tf.RaggedTensor:
        """`[SEP] pieces` of each prompt, int32 ragged [b, (p)], uncut."""
        pieces = tf.cast(self.tokenizer.tokenize(prompt), tf.int32)
        sep = tf.fill([pieces.nrows(), 1], tf.constant(self.tokenizer.sep_id, tf.int32))
        return tf.concat([tf.RaggedTensor.from_tensor(sep), pieces], axis=1)

    def _prompt_length(self, prompt):
        lengths = self._prompt_pieces(prompt).row_lengths()
        return {PROMPT_LENGTH: tf.cast(lengths, tf.int32),
                MAX_PROMPT_LENGTH: tf.constant(self.max_prompt_length, tf.int32),
                MAX_NEW_TOKENS: tf.constant(self.max_new_tokens, tf.int32)}

    def _greedy(self, prompt):
        return self._generate(prompt, 0, 0.0, 0, 1.0, 0)

    def _generate(self, prompt, max_new_tokens, temperature, top_k, top_p, seed):
        if self.max_prompt_length < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens} leaves no position for a "
                             f"prompt (seq_length={self.seq_length})")
        bound = self.max_new_tokens
        limit = tf.cast(max_new_tokens, tf.int32)
        limit = tf.where(limit > 0, tf.minimum(limit, bound), bound)  # (): the new pieces
        pieces = tf.cast(self.tokenizer.tokenize(prompt), tf.int32)  # (b, (p))
        # A long prompt keeps its last pieces: the text the continuation follows.
        count = tf.cast(pieces.row_lengths(), tf.int32)
        first = tf.maximum(count - (self.seq_length - limit - 1), 0)  # (b,) first kept piece
        index = tf.ragged.range(count)
        kept = index.with_flat_values(index.flat_values
                                      >= tf.gather(first, index.value_rowids()))
        pieces = tf.ragged.boolean_mask(pieces, kept)
        sep = tf.fill([pieces.nrows(), 1], tf.constant(self.tokenizer.sep_id, tf.int32))
        ids = tf.concat([tf.RaggedTensor.from_tensor(sep), pieces], axis=1)  # [SEP] pieces
        lengths = tf.cast(ids.row_lengths(), tf.int32)
        prompt_ids = ids.to_tensor(0)  # (b, the longest prompt)
        out = generate(self.model, prompt_ids, lengths, max_new_tokens=bound,
                       new_token_limit=limit, end_id=self.tokenizer.sep_id,
                       temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                       jit_compile=self.jit_compile)
        generated = out["generated_ids"]  # (b, max_new_tokens), 0 after the end or the limit
        return {GENERATED_TEXT: self.tokenizer.detokenize(generated),
                GENERATED_IDS: generated,
                GENERATED_LENGTH: out["generated_lengths"],
                SCORE: tf.cast(out["scores"], tf.float32),
                TRUNCATED: first > 0,  # the prompt lost its first pieces
                **padding_counts(tf.sequence_mask(lengths, tf.shape(prompt_ids)[1]))}
