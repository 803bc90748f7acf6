"""`Run`: what a run builder returns and a command starts; `Settings`: what every run is asked."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Settings:
    """What every run's settings hold (`PretrainSettings`, `FinetuneSettings` add their own).

    Attributes:
      gin_files, gin_params: the gin files and bindings, in order (--gin_file, --gin_param).
      strategy, tpu: the `tf.distribute` strategy's name and TPU address (--strategy, --tpu);
        the run's strategy unless the caller passes one.
    """

    gin_files: tuple[str, ...] = ()
    gin_params: tuple[str, ...] = ()
    strategy: str = "default"
    tpu: str | None = None


@dataclasses.dataclass(frozen=True)
class Run:
    """A built run: its task and the `training.trainer.Trainer` that trains it.

    `trainer.train_and_evaluate()` runs it (a command prints its summary:
    `commands.common.train_and_report`); `trainer.train_iterator()` and
    `trainer.run_steps(iterator, n)` drive its steps one compiled loop at a time (the
    benchmarks).
    """

    task: object
    trainer: object
