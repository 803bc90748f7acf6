"""`bert-train create_pretraining_data`: write pretraining TFRecords from text.

--objective=masked_lm (the default) writes BERT's sentence-pair examples; --objective=causal_lm
packs the documents into blocks of --block_size tokens for next-token pretraining (one [SEP]
before each document, documents spanning blocks, the final partial block dropped). The
objective's family writes them (`plugins.objective(name)`: its `corpus_config`,
`write_corpus` and `corpus_report` run the family's corpus writer); this module names none.
How the text is read and the shards written is one `CorpusOptions`, the same for both.

Input is text files (--input) or a TFDS text dataset (--tfds, one example a document). Files
are in google-research/bert's format (one sentence per line, blank line between documents)
or raw prose (paragraphs split into sentences; Gutenberg headers skipped), detected per file
unless --input_format says. Writes DIR/train-SSSSS-of-NNNNN.tfrecord and
DIR/train-summary.json. Example:

  bert-train create_pretraining_data --input='corpus/*.txt' --vocab=vocab.txt \\
      --output=data/train-*.tfrecord --max_seq_length=128 --dupe_factor=5 --seed=1
  bert-train create_pretraining_data --objective=causal_lm --block_size=256 \\
      --input='corpus/*.txt' --vocab=vocab.txt --output=data/causal-*.tfrecord
  bert-train create_pretraining_data --tfds=wikipedia/20230601.en --data_dir=~/tfds \\
      --vocab=vocab.txt --output=data/wiki-*.tfrecord --num_workers=32

--runner=DirectRunner (or SparkRunner, FlinkRunner, ...) makes the same files
with an Apache Beam pipeline (pip install 'bert-trainer[beam]'); --beam_options passes the
runner's own options, e.g. --beam_options='--direct_num_workers=4'. See docs/data.md.
"""

import dataclasses

from absl import flags

from bert_trainer.commands import shared_flags
from bert_trainer.commands.shared_flags import Flag, Usage
from bert_trainer.data import beam, text_corpus
from bert_trainer.data.corpus_options import CorpusOptions
from bert_trainer.errors import UserError

# The pretraining objectives' names (`plugins.objectives()`, not imported here: it loads
# TensorFlow, and --help should not); each family's objective writes its own data.
OBJECTIVES = ("masked_lm", "causal_lm")

SHARED_FLAGS = shared_flags.declare(
    __name__,
    input=Usage(None, "Text files: comma-separated list and/or globs."),
    output=Usage(None, "Shard pattern with one '*', e.g. DIR/train-*.tfrecord."),
    lower_case=Usage(True, "Lower-case and strip accents (uncased model)."),
    encoding_errors=Usage("strict", "Lines that are not UTF-8: fail, replace bad bytes, or "
                          "skip the line."),
    overwrite=Usage(False, "Replace the shards and summary an earlier run wrote at --output, "
                    "once the new set is complete (other files are refused)."),
    seed=Usage(12345, "Random seed; the same seed and input give the same files (causal_lm: "
               "it shuffles the blocks)."),
    data_dir=Usage(None, "TFDS data directory holding the --tfds dataset, prepared (default: "
                   "TFDS's ~/tensorflow_datasets)."),
    vocab=Flag("string", None, "The WordPiece vocab.txt."),
    tfds=Flag(
        "string", None,
        "A TFDS text dataset instead of --input, e.g. wikipedia/20230601.en: each example is a "
        "document."),
    tfds_split=Flag("string", "train", "The --tfds split (slices such as train[:10%] too)."),
    tfds_text_key=Flag("string", "text", "The --tfds feature holding the text."),
    objective=Flag(
        "enum", OBJECTIVES[0],
        "masked_lm: BERT's sentence pairs; causal_lm: documents packed into blocks of "
        "--block_size tokens for next-token prediction.",
        enum_values=OBJECTIVES),
    block_size=Flag(
        "integer", 256,
        "Tokens per block (causal_lm): the model's training sequence length."),
    input_format=Flag(
        "enum", "auto",
        "lines: one sentence per line, blank line between documents; prose: paragraphs split "
        "into sentences; auto: detect per file.",
        enum_values=text_corpus.INPUT_FORMATS),
    max_seq_length=Flag("integer", 128, "Tokens per example, [CLS]/[SEP] included."),
    short_seq_prob=Flag("float", 0.1, "Probability of a shorter random target length."),
    dupe_factor=Flag("integer", 1, "Passes over the input, each with new random splits."),
    num_shards=Flag("integer", None, "Write this many shards (round-robin)."),
    examples_per_shard=Flag(
        "integer", None,
        "Start a new shard every this many examples (default 100000)."),
    static_masking=Flag(
        "boolean", False,
        "Mask now and write google-research/bert's feature names (input_ids, segment_ids, "
        "masked_lm_*) instead of unmasked examples."),
    max_predictions_per_seq=Flag("integer", 20, "Masked positions per example (static)."),
    masked_lm_prob=Flag("float", 0.15, "Fraction of tokens masked (static)."),
    whole_word_masking=Flag("boolean", False, "Mask whole words (static)."),
    num_workers=Flag(
        "integer", None,
        "Processes making examples (default: this machine's cores); the output is the same for "
        "any number."),
    runner=Flag(
        "string", beam.LOCAL,
        "Where examples are made: local (this machine, "
        "--num_workers processes) or an Apache Beam runner (" +
        ", ".join(beam.BEAM_RUNNERS) + "), with the same output; Beam is an "
        f"extra: {beam.INSTALL}."),
    beam_options=Flag(
        "string", "",
        "The Beam runner's pipeline options, as on its command line, e.g. "
        "'--direct_num_workers=4' (DirectRunner) or '--spark_master_url=spark://HOST:7077' "
        "(SparkRunner)."))
flags.mark_flags_as_mutual_exclusive(["num_shards", "examples_per_shard"])


@dataclasses.dataclass(frozen=True)
class PretrainingDataSettings:
    """The command's flags, read once by `main` (see `--help` for each); nothing below `main`
    reads `FLAGS`.

    Attributes:
      corpus_values: the value of every objective's `corpus_flags` ({"block_size": 256, ...});
        the chosen objective's writer reads its own.
      given: the names of the flags given on the command line.
    """

    input: str | None
    tfds: str | None
    tfds_split: str
    tfds_text_key: str
    data_dir: str | None
    vocab: str | None
    output: str | None
    objective: str
    seed: int
    lower_case: bool
    input_format: str
    encoding_errors: str
    num_shards: int | None
    examples_per_shard: int | None
    overwrite: bool
    num_workers: int | None
    runner: str
    beam_options: str
    corpus_values: dict
    given: frozenset[str]

    @classmethod
    def from_flags(cls, objectives,
                   values: flags.FlagValues = flags.FLAGS) -> "PretrainingDataSettings":
        """The settings of the parsed command line `values`.

        Args:
          objectives: every pretraining objective (`plugins.objectives().values()`): whose
            `corpus_flags` are read.
        """
        derived = ("corpus_values", "given")
        return cls(**{field.name: getattr(values, field.name)
                      for field in dataclasses.fields(cls) if field.name not in derived},
                   corpus_values={name: values[name].value for objective in objectives
                                  for name in objective.corpus_flags},
                   given=frozenset(name for name in values if values[name].present))


def main(argv):
    del argv
    from bert_trainer.tasks import plugins  # noqa: PLC0415 (TensorFlow)

    settings = PretrainingDataSettings.from_flags(plugins.objectives().values())
    beam.check_runner(settings.runner, settings.beam_options, import_beam=False)
    if settings.runner != beam.LOCAL:
        if "num_workers" in settings.given:
            raise UserError(f"--num_workers is for --runner=local; {settings.runner} takes its "
                            "workers from --beam_options (e.g. '--direct_num_workers=4', or "
                            "'--parallelism=32' on Flink)")
        if settings.tfds:
            raise UserError(f"--runner={settings.runner} reads text files (--input); a --tfds "
                            "dataset is read with --runner=local")
        beam.check_runner(settings.runner, settings.beam_options)  # Is Beam installed?
    if settings.input and settings.tfds:
        raise UserError("pass --input (text files) or --tfds (a TFDS dataset), not both")
    for name in ("input" if not settings.tfds else "tfds", "vocab", "output"):
        if not getattr(settings, name):
            raise UserError(f"--{name} is required (see "
                            "'bert-train create_pretraining_data --help')")
    objective = plugins.objective(settings.objective)
    _check_objective_flags(objective, plugins.objectives().values(), settings)
    config = objective.corpus_config(
        seed=settings.seed,
        **{name: settings.corpus_values[name] for name in objective.corpus_flags})
    options = CorpusOptions(
        lower_case=settings.lower_case, input_format=settings.input_format,
        encoding_errors=settings.encoding_errors, num_shards=settings.num_shards,
        examples_per_shard=settings.examples_per_shard, overwrite=settings.overwrite,
        num_workers=_num_workers(settings.num_workers), runner=settings.runner,
        beam_options=settings.beam_options)
    summary = objective.write_corpus(config, _inputs(settings), settings.vocab, settings.output,
                                     options)
    print(f"{objective.corpus_report(summary)}; {_rate(summary)}")
    return 0


def _inputs(settings: PretrainingDataSettings):
    """--input's files, or the --tfds dataset."""
    if not settings.tfds:
        return settings.input
    from bert_trainer.data import tfds_sources  # noqa: PLC0415

    return tfds_sources.TfdsText(settings.tfds, settings.tfds_split, settings.tfds_text_key,
                                 settings.data_dir)


def _num_workers(given: int | None) -> int:
    """--num_workers `given`, else the CPU cores this process may run on."""
    from bert_trainer.data import chunk_workers  # noqa: PLC0415

    return chunk_workers.default_num_workers() if given is None else given


def _rate(summary: dict) -> str:
    """Throughput, overall and per worker process."""
    t = summary["throughput"]
    return (f"{t['text_mb']:,.1f} MB of text at {t['text_mb_per_second']:.2f} MB/s and "
            f"{t['examples_per_second']:,.0f} examples/s on {t['num_workers']} worker(s) "
            f"{'of ' + t['runner'] + ' ' if 'runner' in t else ''}"
            f"({t['text_mb_per_second_per_worker']:.2f} MB/s, "
            f"{t['examples_per_second_per_worker']:,.0f} examples/s per worker)")


def _check_objective_flags(objective, objectives, settings: PretrainingDataSettings) -> None:
    """Refuses a flag given on the command line that another objective reads and the chosen
    one does not."""
    others = [name for other in objectives if other is not objective
              for name in other.corpus_flags if name not in objective.corpus_flags]
    given = [name for name in others if name in settings.given]
    if given:
        raise UserError(f"--{given[0]} does not apply to --objective={settings.objective}; "
                        "drop it (or pick the other --objective)")
