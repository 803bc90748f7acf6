"""How a pretraining corpus is read and written: one options object for every corpus writer.

Every objective's corpus writer (`create_pretraining_data`, `create_causal_lm_data`, through
its family's `Objective.write_corpus`) takes the same `CorpusOptions`; what examples it makes
is its own typed config. `bert-train create_pretraining_data` builds the options once from its
flags. They are checked when built, before any text is read, with the messages the flags'
names give.
"""

import dataclasses

from bert_trainer.data import beam, chunk_workers, text_corpus
from bert_trainer.errors import UserError

DEFAULT_EXAMPLES_PER_SHARD = 100_000  # When neither num_shards nor examples_per_shard is set.


@dataclasses.dataclass(frozen=True)
class CorpusOptions:
    """How a corpus writer reads its text and writes its shards.

    Attributes:
      lower_case: uncased tokenization.
      input_format, encoding_errors: see `text_corpus.read_documents`.
      num_shards / examples_per_shard: at most one; default 100,000 examples per shard.
      overwrite: replace the shards and summary an earlier run wrote at the output (once the
        new set is complete; a failure or Ctrl-C leaves the old set, see
        `pretraining_run.write_shard_set`). Files matching the output that are not such shards
        are refused, with or without it.
      num_workers: processes making examples (see `chunk_workers`); the output is the same
        for any number.
      runner: "local" (this machine, `num_workers` processes) or a Beam runner such as
        "DirectRunner" or "SparkRunner" (`bert_trainer.data.beam`): the same output.
      beam_options: the Beam runner's pipeline options (a string or a sequence of arguments).
    """

    lower_case: bool = True
    input_format: str = "auto"
    encoding_errors: str = "strict"
    num_shards: int | None = None
    examples_per_shard: int | None = None
    overwrite: bool = False
    num_workers: int = 1
    runner: str = beam.LOCAL
    beam_options: str | tuple | list = ()

    def __post_init__(self):
        beam.check_runner(self.runner, self.beam_options, import_beam=False)
        text_corpus.check_reading(self.input_format, self.encoding_errors)
        if self.num_shards is not None and self.examples_per_shard is not None:
            raise UserError("pass --num_shards or --examples_per_shard, not both")
        if (self.num_shards is not None and self.num_shards < 1) or (
                self.examples_per_shard is not None and self.examples_per_shard < 1):
            raise UserError("--num_shards and --examples_per_shard must be >= 1")
        chunk_workers.check_num_workers(self.num_workers)

    @property
    def shard_size(self) -> int | None:
        """Examples per shard: `examples_per_shard`, 100,000 if neither it nor `num_shards` is
        set, else None (`num_shards` shards)."""
        if self.num_shards is None and self.examples_per_shard is None:
            return DEFAULT_EXAMPLES_PER_SHARD
        return self.examples_per_shard


def corpus_options(options: CorpusOptions | None = None, **fields) -> CorpusOptions:
    """`options`, or the `CorpusOptions` of `fields` given as keyword arguments instead (as a
    corpus writer took them before `CorpusOptions`), or the defaults.

    Raises:
      TypeError: both, or a field `CorpusOptions` has not.
    """
    if options is None:
        return CorpusOptions(**fields)
    if fields:
        raise TypeError(f"pass options= or its fields, not both ({sorted(fields)})")
    return options
