"""The one module that registers bert-train builders with gin.

The library itself never imports gin: this module wraps the builders as gin configurables
(`build_encoder.hidden_size = 128` in a .gin file; `@build_encoder()` as a reference).
The wrappers defined here are what picks the bindings up: `configurables.build_encoder()`
is configured, `bert_trainer.encoders.build_encoder()` is not. The task, trainer and
optimizer configs are registered here too.
"""

import gin
from gin import resource_reader

from bert_trainer import config_files, gin_guard
from bert_trainer.encoders import builder
from bert_trainer.errors import UserError
from bert_trainer.models import causal_lm
from bert_trainer.tasks import finetuning
from bert_trainer.tasks.causal_lm import task as causal_lm_task
from bert_trainer.tasks.masked_lm import task as pretraining
from bert_trainer.tasks.squad import task as question_answering
from bert_trainer.training import optimization, trainer

# The gin-configured builders. Call these (not the plain functions) to get the bindings.
build_encoder = gin.external_configurable(builder.build_encoder, module="bert_trainer.encoders")
# The decoder-only language model (`build_causal_lm.num_layers = 4`, configs/causal_lm/*.gin).
build_causal_lm = gin.external_configurable(causal_lm.build_causal_lm,
                                            module="bert_trainer.models")

# --- Training: the trainer, the optimizer and the pretraining task ---------------------------
# Configured by class name in .gin files (`TrainerConfig.train_steps = 1000`); the operative
# config lists every field, defaults included. Build them with `TrainerConfig()` etc. here.
TrainerConfig = gin.external_configurable(trainer.TrainerConfig, module="bert_trainer.training")
OptimizerConfig = gin.external_configurable(optimization.OptimizerConfig,
                                            module="bert_trainer.training")
PretrainingConfig = gin.external_configurable(pretraining.PretrainingConfig,
                                              module="bert_trainer.tasks")
CausalLMConfig = gin.external_configurable(causal_lm_task.CausalLMConfig,
                                           module="bert_trainer.tasks")
# The objectives' names (`Family.objective`; tests/structure/test_family_boundaries.py checks
# the two agree), so that a typo is refused as the gin file is read.
PRETRAINING_OBJECTIVES = ("masked_lm", "causal_lm")


@gin.configurable(module="bert_trainer.tasks")
def pretraining_objective(name: str = "masked_lm") -> str:
    """What `bert-train pretrain` trains: "masked_lm" (BERT: `build_encoder`,
    `PretrainingConfig`) or "causal_lm" (GPT: `build_causal_lm`, `CausalLMConfig`).

    Bound in .gin files (`pretraining_objective.name = 'causal_lm'`, configs/causal_lm/).
    """
    if name not in PRETRAINING_OBJECTIVES:
        raise UserError(f"pretraining_objective.name={name!r} is unknown; use one of "
                        f"{PRETRAINING_OBJECTIVES}")
    return name
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
        gin.add_config_file_search_path(str(config_files.INCLUDE_ROOT))
        _tolerate_namespace_packages()
        _search_path_added = True


def _tolerate_namespace_packages():
    """Keeps gin's package-path reader from failing an include that a later search path holds.

    gin also looks 'configs/base.gin' up as the file base.gin of a Python package `configs`,
    and crashes (TypeError) when `configs` is a folder without `__init__.py` on sys.path (the
    repository root on PYTHONPATH, or the working directory under `python -m`), before it
    tries the later search paths. Its existence check is swapped for one that answers "not
    there" instead; gin has no public way to replace a registered reader.
    """
    readers = gin.config._FILE_READERS  # noqa: SLF001
    for i, (reader, exists) in enumerate(readers):
        if exists is resource_reader.system_path_file_exists:
            readers[i] = (reader, _system_path_file_exists)


def _system_path_file_exists(path: str) -> bool:
    try:
        return resource_reader.system_path_file_exists(path)
    except TypeError:  # a namespace package has no origin file to look beside
        return False


def encoder_from_gin(path, bindings=()):
    """Parses a .gin file (plus optional binding strings) and builds its encoder.

    Args:
      path: a .gin file binding `build_encoder.*`: a path, or a shipped config's name such as
        "configs/encoders/tiny.gin" (found from any working directory, see `config_files.find`).
      bindings: extra gin bindings applied after the file, e.g. ["build_encoder.num_layers = 1"].

    Returns:
      The encoder built by `build_encoder()` under those bindings. The bindings stay in
      gin's global config (so the operative config records them); `gin.clear_config()`
      drops them.

    Raises:
      UserError: the file does not exist, or it (or a binding) imports code or references
        an unregistered callable (`gin_guard`).
    """
    found = config_files.find(str(path))
    if found is None:
        raise UserError(f"encoder_from_gin: {path} does not exist; pass a .gin file such as "
                        f"{config_files.CONFIGS_DIR / 'encoders/tiny.gin'}")
    add_config_search_path()
    gin_guard.check_file(str(found))
    for binding in bindings:
        gin_guard.check_text(binding, f"binding {binding!r}")
    gin.parse_config_files_and_bindings([str(found)], list(bindings))
    return build_encoder()
