"""The one module that registers bert-train builders with gin.

The library itself never imports gin: this module wraps the builders as gin configurables
(`build_encoder.hidden_size = 128` in a .gin file; `@build_encoder()` as a reference).
The wrappers defined here are what picks the bindings up: `configurables.build_encoder()`
is configured, `bert_trainer.encoders.build_encoder()` is not. Later issues add the task,
trainer and optimizer builders here.
"""

import pathlib

import gin

from bert_trainer.encoders import builder
from bert_trainer.errors import UserError
from bert_trainer.tasks import finetuning, pretraining
from bert_trainer.tasks.squad import task as question_answering
from bert_trainer.training import optimization, trainer

# .gin files `include` each other by paths relative to the repository root
# ('configs/encoders/base.gin'); the root is a search path so they load from any cwd.
REPO_ROOT = pathlib.Path(__file__).resolve().parents[1]

# The gin-configured builders. Call these (not the plain functions) to get the bindings.
build_encoder = gin.external_configurable(builder.build_encoder, module="bert_trainer.encoders")

# --- Training: the trainer, the optimizer and the pretraining task ---------------------------
# Configured by class name in .gin files (`TrainerConfig.train_steps = 1000`); the operative
# config lists every field, defaults included. Build them with `TrainerConfig()` etc. here.
TrainerConfig = gin.external_configurable(trainer.TrainerConfig, module="bert_trainer.training")
OptimizerConfig = gin.external_configurable(optimization.OptimizerConfig,
                                            module="bert_trainer.training")
PretrainingConfig = gin.external_configurable(pretraining.PretrainingConfig,
                                              module="bert_trainer.tasks")
# --- end of the training section --------------------------------------------------------------

# --- Fine-tuning: what every task family shares, and SQuAD's windowing and decoding -----------
# `FinetuneConfig.seq_length = 384` in configs/tasks/*.gin; `bert-train finetune` reads the
# task family's file first. Build them with `FinetuneConfig()` / `SquadConfig()` here.
FinetuneConfig = gin.external_configurable(finetuning.FinetuneConfig, module="bert_trainer.tasks")
SquadConfig = gin.external_configurable(question_answering.SquadConfig,
                                        module="bert_trainer.tasks")
_FAMILY_CONFIGS = {question_answering.SquadConfig: SquadConfig}


def configurable(config_class):
    """The gin configurable of a task family's option class (`Family.gin_configs`), registered
    under its class name on first use, so a plugin family's options bind in .gin files."""
    if config_class not in _FAMILY_CONFIGS:
        _FAMILY_CONFIGS[config_class] = gin.external_configurable(
            config_class, module=config_class.__module__)
    return _FAMILY_CONFIGS[config_class]
# --- end of the fine-tuning section -----------------------------------------------------------


_search_path_added = False


def add_config_search_path():
    """Lets `include 'configs/...'` in .gin files resolve from any working directory."""
    global _search_path_added
    if not _search_path_added:
        gin.add_config_file_search_path(str(REPO_ROOT))
        _search_path_added = True


def encoder_from_gin(path, bindings=()):
    """Parses a .gin file (plus optional binding strings) and builds its encoder.

    Args:
      path: a .gin file binding `build_encoder.*`, e.g. "configs/encoders/tiny.gin".
      bindings: extra gin bindings applied after the file, e.g. ["build_encoder.num_layers = 1"].

    Returns:
      The encoder built by `build_encoder()` under those bindings. The bindings stay in
      gin's global config (so the operative config records them); `gin.clear_config()`
      drops them.

    Raises:
      UserError: the file does not exist.
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise UserError(f"encoder_from_gin: {path} does not exist; pass a .gin file such as "
                        f"{REPO_ROOT / 'configs/encoders/tiny.gin'}")
    add_config_search_path()
    gin.parse_config_files_and_bindings([str(path)], list(bindings))
    return build_encoder()
