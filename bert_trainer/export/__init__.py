"""Text-in SavedModels: the tokenizer, the model and the post-processing in one TF graph.

An export answers raw strings in any process that has `tensorflow` and `tensorflow-text`
(bert_trainer is not needed to load or run it). Its signatures, by task family:

    classification  serving_default(text[, text_b])  -> probabilities [b, C] float32,
                                                        label_index [b] int32, label_name [b] string
    regression      serving_default(text[, text_b])  -> score [b] float32
    squad           serving_default(question, context) -> answer [b] string, score [b] float32,
                                                        start, end [b] int32 (characters)
    tagging         serving_default(text)            -> entity_type, entity_text [b, E] string,
                                                        entity_start, entity_end [b, E] int32,
                                                        num_entities [b] int32 (padded, see
                                                        `tagging_serving`)
    causal_lm       serving_default(prompt) (greedy), generate(prompt, temperature, top_k,
                    top_p, seed)                     -> generated_text [b] string,
                                                        generated_ids [b, N] int32,
                                                        generated_length [b] int32, score [b]
                                                        float32; prompt_length(prompt) (see
                                                        tasks/causal_lm/serving.py; no
                                                        serving_ids or encode)
    every family    serving_ids(input_word_ids, input_mask, input_type_ids) -> the task model's
                                                        raw outputs (logits, ...)
                    encode(input_word_ids, input_mask, input_type_ids) -> sequence_output
                                                        [b, s, h], pooled_output [b, h]

Every text signature also returns truncated bool [b] (the input was cut to fit), and
input_tokens, padding_tokens int32 [b]: the real and the [PAD] token slots of the model rows
an input ran as. A batch is padded to its longest row (window, source, prompt), never to
seq_length: the length axis of the model's inputs is dynamic (at most seq_length), so a TF
Serving process computes no more padding than a batch needs.

A pretraining model directory exports `encode` only (there is no task to answer). Character
offsets count Unicode code points of the original string (Python's `str` indices), not bytes.
Texts longer than the task's seq_length are read whole: classification, regression and tagging
cut them into windows and combine the windows' outputs in graph (`bert_trainer/data/windows.py`)
unless the model was fine-tuned with FinetuneConfig.long_texts = "truncate"; SQuAD windows its
contexts.

Modules:
  exporter.py   model_dir -> the family's serving module -> SavedModel (`export_saved_model`)
  predict.py    `bert-train predict`: inputs in, the family's JSON answers out
  graph_check.py  the ops a SavedModel may hold (`allowed_ops.txt`), checked in its
                saved_model.pb before `predict`/`generate --saved_model` load it

The serving-module base (`ServingModule`, `EncoderServing`, `TaskServing`, the signature
names) is `bert_trainer/serving.py`, below the task families that subclass it.
"""

from bert_trainer.export.exporter import build_serving_module, export_saved_model

__all__ = ["build_serving_module", "export_saved_model"]
