"""Worker side of the causal-LM benchmark's generation section (a bench/worker.py entry).

Four kinds, each one `generate` call per unit on the same batch of random prompts:

- `cached`: bert-train's `generation.causal.generate` with the key/value cache (greedy), as
  it runs by default: the prefill and the loop compiled with XLA.
- `uncached`: the same with `use_cache=False` (the whole prefix re-run at every step; its
  input grows every step, so the graph executor runs it).
- `cached_graph`: the cached one with `jit_compile=False`, in the graph executor as an export
  runs it (an extra row, not a target).
- `keras_hub`: `keras_hub.models.GPT2CausalLM.generate` compiled with the greedy sampler
  (its cached `call_with_cache` loop; keras-hub leaves XLA off on a CPU-only machine), prompts
  given as `token_ids` padded to prompt + new tokens with a `padding_mask`, and no stop token,
  so it always decodes every position.

The weights are random. bert-train's generate stops a row at its end token, so for equal work
its end token is one the model cannot emit (`_end_id`); every row then decodes exactly
`max_new_tokens` tokens, as keras-hub's does (`build` checks the first call). Tokens/s counts
the new tokens: batch x max_new_tokens per call.
"""

import numpy as np
import tensorflow as tf

from bench import causal_lm_models as models

KINDS = ("cached", "uncached", "cached_graph", "keras_hub")


def prompts(vocab_size: int, batch_size: int, prompt_length: int, seed: int = 0) -> np.ndarray:
    """[batch, prompt_length] int32 random ids (no special tokens), the same for every kind."""
    rng = np.random.default_rng(seed)
    return rng.integers(5, vocab_size, (batch_size, prompt_length)).astype(np.int32)


def _end_id(model) -> int:
    """An id outside the vocabulary: the model can never emit it, so every row decodes
    max_new_tokens tokens (`build` checks the first call's output)."""
    return int(model.vocab_size)


def build(kind: str, vocab_size: int, size: str, batch_size: int, prompt_length: int,
          max_new_tokens: int, seed: int = 0):
    """Worker entry: run(n) generates n times; info has the new tokens per call."""
    import keras  # noqa: PLC0415

    keras.utils.set_random_seed(seed)
    parsed = models.Size.parse(size)
    max_length = prompt_length + max_new_tokens
    ids = prompts(vocab_size, batch_size, prompt_length, seed)
    if kind == "keras_hub":
        model = models.keras_hub_gpt2(vocab_size, parsed, max_length, dropout=0.0)
        model.compile(sampler="greedy")
        padded = np.zeros((batch_size, max_length), np.int32)
        padded[:, :prompt_length] = ids
        inputs = {"token_ids": tf.constant(padded),
                  "padding_mask": tf.constant(padded != 0)}

        def generate_once() -> np.ndarray:
            out = model.generate(inputs, stop_token_ids=None)
            return np.asarray(out["token_ids"])[:, prompt_length:]
    elif kind in ("cached", "uncached", "cached_graph"):
        from bert_trainer.models.generation import causal as causal_generation  # noqa: PLC0415

        model = models.bert_train_causal_lm(vocab_size, parsed, max_length, dropout=0.0)
        end_id = _end_id(model)
        lengths = tf.fill([batch_size], prompt_length)

        @tf.function
        def generate_fn(prompt_ids):
            return causal_generation.generate(
                model, prompt_ids, lengths, max_new_tokens=max_new_tokens, end_id=end_id,
                use_cache=kind != "uncached",
                jit_compile=False if kind == "cached_graph" else None)

        def generate_once() -> np.ndarray:
            out = generate_fn(tf.constant(ids))
            return out["generated_ids"].numpy()
    else:
        raise ValueError(f"unknown kind {kind!r}; one of {KINDS}")
    first = generate_once()  # Tracing, oneDNN primitives; and the equal-work check.
    # bert-train's rows hold 0 after their end; keras-hub's always run to the end (and may
    # emit id 0, an ordinary token to its random weights).
    ended = kind != "keras_hub" and not (first != 0).all()
    if first.shape != (batch_size, max_new_tokens) or ended:
        raise RuntimeError(f"{kind}: a row stopped before {max_new_tokens} new tokens; the "
                           "comparison needs equal work")

    def run(n: int) -> dict:
        for _ in range(n):
            generate_once()  # numpy(): waits for the tokens.
        return {"tokens": n * batch_size * max_new_tokens}

    return {"params": models.num_params(model),
            "tokens_per_call": batch_size * max_new_tokens}, run
