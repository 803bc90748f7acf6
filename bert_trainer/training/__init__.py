"""The training engine: a custom distributed loop that runs any `bert_trainer.tasks.Task`.

    trainer.py       Trainer (the host loop; re-exports the names of config.py)
    config.py        TrainerConfig, RunResult, NonFiniteError
    train_step.py    TrainStep: the compiled step (accumulation, all-reduce, NaN guard, clipping)
    optimization.py  OptimizerConfig, AdamW/LAMB/SGD, warmup + polynomial decay, precision
    preemption.py    clean stops on SIGTERM/SIGINT/SIGHUP (one worker, or the cluster handler)
    summaries.py     TensorBoard, operative gin config, progress line
    throughput.py    matmul peak, examples/tokens/s, MFU, padding (the task counts FLOPs)
    rollback.py      NaN/Inf rollback bookkeeping: skipped steps and where to skip data
    time_budget.py   a run bounded by wall-clock time: the clock, the schedule on its fraction
    strategies.py    get_strategy(name), the chief-only-writes rule
    checkpoint_eval.py  evaluate_checkpoint: one checkpoint of a run on its eval split
    determinism.py   seeds and deterministic ops
    run_lock.py      one run per model_dir: the lock file naming its holder, stale ones taken over

Resuming, checkpoint integrity, the best checkpoint and writes that fail cleanly on a full disk
(`storage.py`) live in `bert_trainer.checkpoints`.
"""

from bert_trainer.errors import Preempted
from bert_trainer.training.optimization import OptimizerConfig
from bert_trainer.training.strategies import get_strategy
from bert_trainer.training.trainer import NonFiniteError, RunResult, Trainer, TrainerConfig

__all__ = ["NonFiniteError", "OptimizerConfig", "Preempted", "RunResult", "Trainer",
           "TrainerConfig", "get_strategy"]
