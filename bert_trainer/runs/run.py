"""`Run`: what a run builder returns and a command starts."""

import dataclasses


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
