"""Extractive question answering (SQuAD v1.1 / v2.0): start and end logits over the tokens.

Training windows come from `data/squad_data.squad_dataset`; the loss is the mean of the start
and end cross-entropies (google-research/bert's). Evaluation gathers every window's logits and
its `UNIQUE_IDS` to the host, where `postprocess_squad` turns them into answer text (the
original context between the predicted pieces' character offsets) and
`metrics.squad.squad_evaluate` scores it with the official normalization.
"""

import dataclasses

import keras

from bert_trainer import features as F
from bert_trainer.data import length_buckets
from bert_trainer.errors import UserError, require_positive_ints
from bert_trainer.features import END_LOGITS, START_LOGITS
from bert_trainer.metrics import squad as squad_metrics
from bert_trainer.models import BertSpanLabeler
from bert_trainer.tasks.finetuning import DataConfig, EncoderSpec, FinetuneConfig, FinetuningTask
from bert_trainer.tasks.squad import data as squad_data


@dataclasses.dataclass(frozen=True)
class SquadConfig:
    """Windowing and answer decoding (gin: `SquadConfig.*`); google-research/bert's defaults.

    Attributes:
      doc_stride: word pieces between the starts of consecutive context windows.
      max_query_length: question pieces kept.
      max_answer_length: longest answer, in pieces.
      n_best: start and end candidates considered per window.
      null_threshold: v2.0 answers "" when the [CLS] score beats the best span by more.
    """

    doc_stride: int = 128
    max_query_length: int = 64
    max_answer_length: int = 30
    n_best: int = 20
    null_threshold: float = 0.0

    def __post_init__(self):
        require_positive_ints(self, ("doc_stride", "max_query_length", "max_answer_length",
                                     "n_best"), prefix="SquadConfig.")


class QuestionAnsweringTask(FinetuningTask):
    """SQuAD-style span extraction with `BertSpanLabeler`.

    Args:
      task_data: a "squad" `TaskData`; its TFDS name ending in "v2.0" (task `squad_v2`)
        selects SQuAD v2.0 (unanswerable questions point at [CLS]).
      encoder, config, data: see `FinetuningTask`.
      squad: windowing and decoding options (None: the defaults).

    Attributes:
      version_2: SQuAD v2.0 rules for labels, decoding and scoring.
      last_predictions: {question id: answer text} of the last `aggregate_eval`.
    """

    family = "squad"
    best_metric = "f1"

    def __init__(self, task_data, encoder: EncoderSpec, *,
                 config: FinetuneConfig | None = None, data: DataConfig | None = None,
                 squad: SquadConfig | None = None):
        super().__init__(task_data, encoder, config=config, data=data)
        self.squad = squad = squad or SquadConfig()
        self.version_2 = (task_data.tfds_name or "").endswith("v2.0")
        if self.config.seq_length < squad.max_query_length + 4:
            raise UserError(f"seq_length={self.config.seq_length} leaves no room for the context "
                            f"after max_query_length={squad.max_query_length}; raise "
                            "--seq_length or lower SquadConfig.max_query_length")
        self._eval_data = None
        self.last_predictions = {}

    @classmethod
    def head_model(cls, encoder: keras.Model) -> keras.Model:
        return BertSpanLabeler(encoder, name="bert_span_labeler")

    def _window_options(self) -> dict:
        return dict(seq_length=self.config.seq_length, doc_stride=self.squad.doc_stride,
                    max_query_length=self.squad.max_query_length, version_2=self.version_2)

    def build_inputs(self, split, input_context, *, is_training):
        if is_training:
            return squad_data.squad_dataset(
                self.raw_examples(split), self.tokenizer, **self._window_options(),
                options=self.pipeline_options(True, input_context))
        # Every input pipeline reads every question: each host then holds all the windows that
        # `aggregate_eval` decodes. Duplicate windows gathered from several workers carry the
        # same logits, so they change no score.
        options = dataclasses.replace(self.pipeline_options(False, input_context),
                                      input_context=None)
        self._eval_data = squad_data.squad_eval_data(
            self.raw_examples(split), self.tokenizer, **self._window_options(), options=options)
        return self._eval_data.dataset

    def build_losses(self, features, outputs):
        start = keras.losses.sparse_categorical_crossentropy(
            features[F.START_POSITIONS], outputs[START_LOGITS], from_logits=True)
        end = keras.losses.sparse_categorical_crossentropy(
            features[F.END_POSITIONS], outputs[END_LOGITS], from_logits=True)
        return {"loss": (start + end) / 2.0}  # (batch,)

    def build_metrics(self, training):
        return [keras.metrics.SparseCategoricalAccuracy(name="start_accuracy"),
                keras.metrics.SparseCategoricalAccuracy(name="end_accuracy"),
                keras.metrics.Sum(name="cut_questions")]  # cut to max_query_length

    def update_metrics(self, metrics, features, outputs):
        metrics[0].update_state(features[F.START_POSITIONS], outputs[START_LOGITS])
        metrics[1].update_state(features[F.END_POSITIONS], outputs[END_LOGITS])
        if squad_data.CUT in features:
            metrics[2].update_state(keras.ops.cast(features[squad_data.CUT], "float32"))

    def eval_step_outputs(self, features, outputs):
        # Batches may be cut short (length buckets): pad the logits back to the window length
        # with a value no answer span can win with.
        width = self.config.seq_length
        return {START_LOGITS: length_buckets.pad_to_width(outputs[START_LOGITS], width, -1e4),
                END_LOGITS: length_buckets.pad_to_width(outputs[END_LOGITS], width, -1e4),
                squad_data.UNIQUE_IDS: features[squad_data.UNIQUE_IDS]}

    def aggregate_eval(self, gathered):
        """Exact match and F1 (0-100) on the answer text of the questions evaluated.

        With `eval_steps` limiting the evaluation, only questions whose windows were all
        evaluated are scored ("num_questions" says how many).
        """
        if self._eval_data is None or squad_data.UNIQUE_IDS not in gathered:
            return {}
        examples, windows = self._eval_data.examples, self._eval_data.features
        seen = {int(u) for u in gathered[squad_data.UNIQUE_IDS]}
        complete = set(range(len(examples)))
        complete -= {w.example_index for w in windows if w.unique_id not in seen}
        predictions = squad_data.postprocess_squad(
            examples, [w for w in windows if w.unique_id in seen],
            gathered[START_LOGITS], gathered[END_LOGITS], n_best=self.squad.n_best,
            max_answer_length=self.squad.max_answer_length, version_2=self.version_2,
            null_threshold=self.squad.null_threshold,
            unique_ids=gathered[squad_data.UNIQUE_IDS])
        if not complete:
            return {}
        gold = {examples[i].id: examples[i].answer_texts for i in sorted(complete)}
        self.last_predictions = {qid: predictions[qid] for qid in gold}
        scores = squad_metrics.squad_evaluate(gold, self.last_predictions,
                                              version_2=self.version_2)
        results = {k: float(v) for k, v in scores.items()
                   if k.endswith(("exact_match", "f1"))}
        results["num_questions"] = float(len(gold))
        return results

    def task_info(self) -> dict:
        return {**super().task_info(), "version_2": self.version_2,
                "squad": dataclasses.asdict(self.squad)}
