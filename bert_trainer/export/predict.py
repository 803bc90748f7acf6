"""`bert-train predict`: stream text through a model, one JSON object per input.

Inputs (`--format`, default from the file's extension: .tsv, .jsonl/.json, else text):
  text   one input per line (models with one text input only);
  tsv    tab-separated columns in the model's input order (`text[, text_b]` or
         `question, context`), or in any order under a header row naming them;
  jsonl  one JSON object per line with the input names as keys (extra keys are ignored).
Blank lines are skipped. A line that cannot be read (not UTF-8, bad JSON, missing field, wrong
column count) is reported on stderr with its line number; `on_error="skip"` counts it and goes
on, `"stop"` raises a `UserError` naming file:line (stdout gets what came before it; an output
file is written only when complete, so an existing one is left as it was).

Inputs are answered in windows of `window_batches` batches: a window is sorted by length
(characters), cut into batches, and its answers are written in input order, so a batch holds
texts of similar length and the signature pads little (it pads a batch to its longest row;
its `input_tokens` / `padding_tokens` outputs say how much, and the summary counts them).

Outputs, one JSON line per input, in input order: {"line": N, <the inputs>, <the answer>}
with the answer as the task family writes it (`Family.format_answer`):
  classification {"label", "label_index", "probabilities": [per class, in label order]}
  regression     {"score"}
  squad          {"answer", "score", "start", "end"} (characters; score null if no span)
  tagging        {"entities": [{"type", "text", "start", "end"}, ...]} (characters)
  translate      {"translation", "score"} (the input is "input": {"line", "input", ...}),
                 plus "truncated": true when the source was cut to seq_length
  causal_lm      {"generated", "score"} (greedy; the input is "prompt"; `bert-train generate`
                 samples too)
Every family adds "truncated": true when the input was cut to fit (no silent truncation): a
text (pair) or sentence under FinetuneConfig.long_texts = "truncate", a pair's first text cut
to leave room for the second's windows, a question cut to max_query_length, a translate source
cut to seq_length, a prompt that kept only its last pieces. Exports made before say nothing.
The family comes from the model directory's bert_train.json or the export's family record;
an export written before that record is recognized by its output names.

A predictor is the export's `serving_default` signature: built in-process from a model
directory (`export.build_serving_module`) or, on the CPU, from the model an export records
(`exporter.rebuild_module`), and traced here with the fused kernels and token packing; or an
export's own graph (an export without that record, or off the CPU). All give the same
answers within float32 rounding. A text longer than the model's `seq_length` is answered from all
of it: the signature cuts it into windows and combines their outputs in graph, as the
fine-tuning evaluation does (`bert_trainer/data/windows.py`), unless the model was trained
with FinetuneConfig.long_texts = "truncate". One model call runs every window of a batch's
texts, so very long texts may want a smaller `batch_size`.
"""

import contextlib
import dataclasses
import itertools
import json
import os
import sys
import time
from collections.abc import Callable, Iterable

import numpy as np

from bert_trainer import ops, outputs
from bert_trainer.errors import UserError
from bert_trainer.export import exporter, graph_check, length_window
from bert_trainer.export.predict_inputs import (  # noqa: F401 (part of predict's API)
    FORMATS,
    HEADER_ALIASES,
    BadLine,
    detect_format,
    parse_line,
    read_inputs,
)
from bert_trainer.export.progress import Progress  # noqa: F401 (part of predict's API)
from bert_trainer.serving import INPUT_TOKENS, PADDING_TOKENS
from bert_trainer.tasks import plugins
from bert_trainer.tasks.family import Family

ON_ERROR = ("skip", "stop")


@dataclasses.dataclass
class Predictor:
    """A batch function over raw strings.

    Attributes:
      input_names: the text inputs, in TSV column order, e.g. ("text", "text_b").
      fn: {name: string tensor [b]} -> {output name: tensor [b, ...]}.
      family: the name of the task family that formats the answers (given a `Family`, its
        name is kept; `answers` is the family object).
      tokenizer: the model's `Tokenizer` (or one built from an export's vocabulary): a
        window is sorted by word pieces; None: by characters, a rougher guess.
      in_process: `fn` was traced here (a model directory, or an export rebuilt by
        `exporter.rebuild_module`), with the fused kernels and token packing where this
        process has them; False: an export's own graph.
    """

    input_names: tuple[str, ...]
    fn: Callable
    family: str
    tokenizer: object = None
    in_process: bool = False

    def __post_init__(self):
        if isinstance(self.family, Family):
            self.family = self.family.name
        self.answers = plugins.get_family(self.family)  # Unknown names fail here.

    def __call__(self, batch: dict[str, list[str]]) -> dict[str, np.ndarray]:
        import tensorflow as tf  # Lazy: parsing inputs needs no TensorFlow.

        outputs = self.fn(**{k: tf.constant(v, tf.string) for k, v in batch.items()})
        return {k: v.numpy() for k, v in outputs.items()}

    def lengths(self, inputs: list[dict]) -> list[int]:
        """What a window sorts by (`length_window.input_lengths`)."""
        return length_window.input_lengths(self.tokenizer, self.input_names, inputs)


def _family(output_names) -> Family:
    """The family whose `answer_outputs` the signature returns (the most specific one)."""
    names = set(output_names)
    matches = [f for f in plugins.families()
               if f.answer_outputs and set(f.answer_outputs) <= names]
    if not matches:
        raise UserError(f"the serving_default signature returns {sorted(names)}, not the "
                        "outputs of a bert-train text export; re-export with 'bert-train "
                        "export' (or name a plugin family's module with --family_module)")
    return max(matches, key=lambda f: len(f.answer_outputs))


def _ordered(names, family: Family) -> tuple[str, ...]:
    """The inputs in the family's column order (a loaded signature sorts them by name)."""
    for order in family.input_orders:
        if set(order) == set(names):
            return order
    return tuple(sorted(names))


def load_predictor(*, model_dir: str | None = None, saved_model: str | None = None,
                   checkpoint: str | None = None, seq_length: int | None = None,
                   trust_saved_model: bool = False, rebuild: bool = True) -> Predictor:
    """The text predictor of a SavedModel or of a model directory (exactly one of them).

    Args:
      model_dir: a bert-train model directory; its model is wrapped in-process.
      saved_model: a directory written by `bert-train export`.
      checkpoint, seq_length: model directory only (see `export.build_serving_module`).
      trust_saved_model: load a SavedModel whose graph holds ops bert-train's exports never
        use (else refused before loading: `graph_check.check_saved_model`).
      rebuild: on the CPU, serve an export that records its model (`exporter.rebuild_module`)
        from the model rebuilt here, as `model_dir` is served, not from its graph.

    Returns:
      A `Predictor`.
    """
    import tensorflow as tf
    import tensorflow_text  # noqa: F401 (registers the tokenizer ops an export uses)

    if (model_dir is None) == (saved_model is None):
        raise UserError("pass exactly one of --model_dir and --saved_model")
    if model_dir is not None:
        module = exporter.build_serving_module(model_dir, checkpoint=checkpoint,
                                               seq_length=seq_length)
        if not hasattr(module, "text_function"):
            raise UserError(f"{model_dir} is a pretraining model directory: it has no task to "
                            "predict; fine-tune it first (bert-train finetune)")
        return _in_process(module)
    if not os.path.isfile(os.path.join(saved_model, "saved_model.pb")):
        raise UserError(f"--saved_model={saved_model} holds no saved_model.pb; pass a directory "
                        "written by 'bert-train export'")
    graph_check.check_saved_model(saved_model, ["serving_default"], trust=trust_saved_model)
    record = exporter.read_family(saved_model)
    if rebuild and record is not None and ops.dynamic_shapes_are_free():  # the CPU
        module = exporter.rebuild_module(saved_model, record)
        if module is not None:
            return _in_process(module)
    loaded = tf.saved_model.load(saved_model)
    if "serving_default" not in loaded.signatures:
        raise UserError(f"--saved_model={saved_model} has no serving_default signature (only "
                        f"{', '.join(loaded.signatures)}): it encodes token ids, it does not "
                        "answer text; export a fine-tuned model directory")
    fn = loaded.signatures["serving_default"]
    names = list(fn.structured_input_signature[1])
    if record is not None and record.get("family"):
        family = plugins.family_from_info(record, os.path.join(saved_model,
                                                                exporter.FAMILY_FILE))
    else:  # An export written before exports recorded their family.
        family = _family(fn.structured_outputs)
    return Predictor(_ordered(names, family), fn, family,
                     length_window.export_tokenizer(saved_model))


def _in_process(module) -> Predictor:
    """The predictor of a serving module served here, never saved: traced with the fused
    kernels and token packing where this process has them, as fine-tuning runs (an export
    holds TensorFlow's ops only), and XLA for the decoding loops."""
    module.portable = False
    if hasattr(module, "jit_compile"):  # XLA is in this process (an export leaves it off)
        module.jit_compile = True
    fn = module.text_function()
    names = [spec.name for spec in fn.input_signature]
    family = plugins.get_family(module.family)
    return Predictor(_ordered(names, family), fn, family, module.tokenizer, in_process=True)


def format_answer(family: Family | str, outputs: dict, i: int) -> dict:
    """The JSON answer of row `i` of a batch's outputs, as `family` (or its name) writes it."""
    if isinstance(family, str):
        family = plugins.get_family(family)
    return family.format_answer(outputs, i)


@dataclasses.dataclass
class PredictSummary:
    """What a run did: inputs answered, bad lines skipped, the wall time, and the token slots
    the model computed: real tokens and padding (None: the export does not say)."""

    answered: int = 0
    skipped: int = 0
    seconds: float = 0.0
    input_tokens: int | None = None
    padding_tokens: int | None = None

    def count(self, outputs: dict) -> None:
        """Adds a batch's `input_tokens` and `padding_tokens` outputs, where it has them."""
        if INPUT_TOKENS in outputs and PADDING_TOKENS in outputs:
            self.input_tokens = (self.input_tokens or 0) + int(outputs[INPUT_TOKENS].sum())
            self.padding_tokens = (self.padding_tokens or 0) + int(outputs[PADDING_TOKENS].sum())

    def report(self) -> str:
        """E.g. "answered 872 inputs in 3.1s (281.3 inputs/s; padding 9.1% of 30112 slots)"."""
        rate = self.answered / max(self.seconds, 1e-9)
        if self.padding_tokens is None:
            padding = "padding not counted by this export"
        else:
            slots = self.input_tokens + self.padding_tokens
            padding = f"padding {100 * self.padding_tokens / max(slots, 1):.1f}% of {slots} slots"
        return (f"answered {self.answered} inputs in {self.seconds:.1f}s ({rate:.1f} inputs/s; "
                f"{padding})")


def _answer_window(predictor: Predictor, pending: list, write, *, batch_size: int,
                   summary: PredictSummary, progress_update) -> None:
    """Answers a window of (line, inputs): sorted by length, in batches of `batch_size`;
    writes its JSON lines in input order."""
    lengths = predictor.lengths([inputs for _, inputs in pending])
    order = sorted(range(len(pending)), key=lengths.__getitem__)
    answers = [None] * len(pending)
    for first in range(0, len(order), batch_size):
        rows = order[first:first + batch_size]
        outputs = predictor({name: [pending[i][1][name] for i in rows]
                             for name in predictor.input_names})
        summary.count(outputs)
        for j, i in enumerate(rows):
            answers[i] = predictor.answers.format_answer(outputs, j)
        summary.answered += len(rows)
        progress_update()
    for (line, inputs), answer in zip(pending, answers, strict=True):
        write(json.dumps({"line": line, **inputs, **answer}, ensure_ascii=False) + "\n")


def predict_lines(predictor: Predictor, lines: Iterable[bytes], write: Callable[[str], None], *,
                  fmt: str, batch_size: int = 32, window_batches: int = 32,
                  on_error: str = "skip", source: str = "<input>",
                  progress: Progress | None = None) -> PredictSummary:
    """Answers every input of `lines`, in windows grouped by length; writes one JSON line
    each, in input order.

    Args:
      predictor: from `load_predictor`.
      lines: raw input lines (bytes).
      write: receives each output line (JSON + newline).
      fmt: "text", "tsv" or "jsonl".
      batch_size: inputs per model call.
      window_batches: batches per window: `batch_size * window_batches` inputs are read,
        sorted by length and batched before any is written (1: batches in input order).
      on_error: "skip" (report and count bad lines) or "stop" (UserError at the first).
      source: the input's name in messages.
      progress: where progress and skipped lines are reported (None: nowhere).

    Returns:
      A `PredictSummary`.
    """
    if batch_size < 1:
        raise UserError(f"--batch_size={batch_size} must be >= 1")
    if window_batches < 1:
        raise UserError(f"--window_batches={window_batches} must be >= 1 (1: no length "
                        "grouping)")
    if on_error not in ON_ERROR:
        raise UserError(f"--on_error={on_error} is unknown; use skip or stop")
    summary, pending, number, first_bad = PredictSummary(), [], 0, None
    start = time.perf_counter()

    def update():
        if progress is not None:
            progress.update(number, summary.answered)

    def flush():
        _answer_window(predictor, pending, write, batch_size=batch_size, summary=summary,
                       progress_update=update)
        pending.clear()

    for number, item in read_inputs(lines, fmt, predictor.input_names):
        if isinstance(item, str):
            first_bad = first_bad or (number, item)
            if on_error == "stop":
                if pending:
                    flush()
                raise UserError(f"{source}:{number}: the line {item}; fix it or pass "
                                "--on_error=skip")
            summary.skipped += 1
            if progress is not None:
                progress.message(f"{source}:{number}: skipped: the line {item}")
            continue
        pending.append((number, item))
        if len(pending) == batch_size * window_batches:
            flush()
    if pending:
        flush()
    summary.seconds = time.perf_counter() - start
    if progress is not None:
        progress.update(number, summary.answered, final=True)
    if summary.skipped and not summary.answered:
        raise UserError(f"{source}: none of its {summary.skipped} input lines could be read "
                        f"(first: line {first_bad[0]} {first_bad[1]}); the model reads "
                        f"{', '.join(predictor.input_names)}: give a TSV header naming them, "
                        "or --format=text/jsonl")
    return summary


def _count_lines(path: str) -> int:
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def is_predictions_file(path: str) -> bool:
    """Whether `path` is empty or holds predict's JSON lines (checked on its first lines).

    This is what `predict --overwrite` may replace; any other file is kept.
    """
    try:
        with open(path, "rb") as f:
            head = [line for line in itertools.islice(f, _CHECKED_LINES) if line.strip()]
        records = [json.loads(line) for line in head]
    except (OSError, ValueError):  # ValueError: not JSON, not UTF-8
        return False
    return all(isinstance(r, dict) and isinstance(r.get("line"), int) for r in records)


_CHECKED_LINES = 5
PREDICTIONS = outputs.Kind("predict", "a predictions file (JSON lines written by bert-train "
                           "predict)", directory=False, recognizes=is_predictions_file)


def check_output(output_path: str, overwrite: bool = False) -> str:
    """`output_path` made absolute ("-" as is), once it is known that writing it loses nothing.

    Raises:
      UserError: it exists (without `overwrite`), is not a predictions file, or lies in a
        model directory (see `outputs.check_output`).
    """
    if output_path == "-":
        return output_path
    return outputs.check_output(output_path, PREDICTIONS, overwrite=overwrite)


def run_predict(predictor: Predictor, input_path: str, output_path: str, *,
                fmt: str | None = None, batch_size: int = 32, window_batches: int = 32,
                on_error: str = "skip", overwrite: bool = False,
                stderr=None) -> PredictSummary:
    """`bert-train predict` on files ('-' is stdin / stdout).

    An output file is written aside and renamed into place when every input is answered:
    a refused input (or any failure) leaves an existing `output_path` as it was.

    Args:
      predictor: from `load_predictor`.
      input_path, output_path: files, or "-".
      fmt: see `detect_format`.
      batch_size, window_batches, on_error: see `predict_lines`.
      overwrite: replace an existing `output_path` that is a predictions file.
      stderr: progress and messages (default sys.stderr).

    Returns:
      A `PredictSummary`.
    """
    stderr = stderr or sys.stderr
    fmt = detect_format(input_path, fmt)
    if input_path != "-" and not os.path.isfile(input_path):
        raise UserError(f"--input={input_path} does not exist; pass a file or - for stdin")
    output_path = check_output(output_path, overwrite)
    total = None if input_path == "-" else _count_lines(input_path)
    progress = Progress(stderr, total)
    source = "<stdin>" if input_path == "-" else input_path
    with contextlib.ExitStack() as stack:
        reader = (sys.stdin.buffer if input_path == "-"
                  else stack.enter_context(open(input_path, "rb")))
        if output_path == "-":
            stack.callback(sys.stdout.flush)
            write = sys.stdout.write
        else:
            write = stack.enter_context(outputs.new_file(output_path, writing="predictions")).write
        return predict_lines(predictor, reader, write, fmt=fmt, batch_size=batch_size,
                             window_batches=window_batches, on_error=on_error, source=source,
                             progress=progress)
