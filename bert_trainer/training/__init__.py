"""The training engine: a custom distributed loop that runs any `bert_trainer.tasks.Task`.

    trainer.py       Trainer, TrainerConfig, RunResult, NonFiniteError (the host loop)
    train_step.py    TrainStep: the compiled step (accumulation, all-reduce, NaN guard, clipping)
    optimization.py  OptimizerConfig, AdamW/LAMB/SGD, warmup + polynomial decay, precision
    checkpointing.py resume, architecture checks, the best checkpoint
    summaries.py     TensorBoard, operative gin config, progress line
    strategies.py    get_strategy(name), the chief-only-writes rule
    determinism.py   seeds and deterministic ops
"""

from bert_trainer.training.optimization import OptimizerConfig
from bert_trainer.training.strategies import get_strategy
from bert_trainer.training.trainer import NonFiniteError, RunResult, Trainer, TrainerConfig

__all__ = ["NonFiniteError", "OptimizerConfig", "RunResult", "Trainer", "TrainerConfig",
           "get_strategy"]
