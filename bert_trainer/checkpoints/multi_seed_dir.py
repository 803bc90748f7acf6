"""A multi-seed run's directory: MODEL_DIR/multi_seed.json and its seed-N model directories.

`bert-train finetune --seeds=...` (`bert_trainer.tasks.multi_seed`) writes MODEL_DIR/multi_seed.json
first and each seed's model directory as MODEL_DIR/seed-N. This module reads that layout and
decides whose a directory is: a multi-seed parent is refused where one model directory is
expected (`refuse_parent`, used by `model_dir.read_model_info`), a single-seed run is refused
in a multi-seed run's directory and the reverse. It sits with the model directory so that reading
one needs nothing from the task layer.
"""

import json
import os
import re

from bert_trainer import outputs
from bert_trainer.errors import UserError

MANIFEST_FILE = "multi_seed.json"
EVAL_RESULTS_FILE = "eval_results.json"  # the same name as a single run's (finetuning.py)
FORMAT_NAME, FORMAT_VERSION = "bert_train_multi_seed", 1
_SEED_DIR = re.compile(r"seed-(\d+)")


def seed_dir(model_dir: str, seed: int) -> str:
    """MODEL_DIR/seed-N: the model directory of one seed's run."""
    return os.path.join(model_dir, f"seed-{seed}")


def read_manifest(model_dir: str) -> dict | None:
    """MODEL_DIR/multi_seed.json, or None when MODEL_DIR is not a multi-seed run's.

    Raises:
      UserError: the file exists but is not a multi-seed manifest (names the file).
    """
    path = os.path.join(model_dir, MANIFEST_FILE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"{path} cannot be read ({e}); restore it, or use another "
                        "--model_dir") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise UserError(f"{path}: 'format' must be '{FORMAT_NAME}'; restore it, or use "
                        "another --model_dir")
    return manifest


def manifest_seeds(manifest: dict) -> list[int]:
    """The run seeds a manifest lists, sorted."""
    return sorted(int(s) for s in manifest.get("seeds", {}) if str(s).isdigit())


def seeds_flag(seeds: list[int]) -> str:
    """The --seeds flag that runs `seeds`, e.g. "--seeds=1,2,3"."""
    return "--seeds=" + ",".join(map(str, seeds))


def refuse_parent(model_dir: str) -> None:
    """Refuses MODEL_DIR of a multi-seed run where one model directory is expected.

    `evaluate`, `export` and `predict` read one model; a multi-seed run's models are its
    seed-N directories.

    Raises:
      UserError: naming `--model_dir=MODEL_DIR/seed-N` and the seeds' combined results.
    """
    manifest = read_manifest(model_dir)
    if manifest is None:
        return
    seeds = manifest_seeds(manifest) or [1]
    raise UserError(f"--model_dir={model_dir} holds a multi-seed run (seeds "
                    f"{', '.join(map(str, seeds))}); pass one seed's model directory, e.g. "
                    f"--model_dir={seed_dir(model_dir, seeds[0])} (all seeds' metrics: "
                    f"{os.path.join(model_dir, EVAL_RESULTS_FILE)})")


def check_single_run_dir(model_dir: str) -> None:
    """Refuses a single-seed finetune in a multi-seed run's directory or in one of its seeds.

    Raises:
      UserError: MODEL_DIR holds a multi-seed run, or is its seed-N directory (a seed is
        resumed by rerunning the multi-seed command, which binds that seed's streams).
    """
    manifest = read_manifest(model_dir)
    if manifest is not None:
        raise UserError(f"--model_dir={model_dir} holds a multi-seed run; resume it with "
                        f"{seeds_flag(manifest_seeds(manifest))}, or choose another "
                        "--model_dir")
    parent, name = os.path.split(os.path.normpath(model_dir))
    found = _SEED_DIR.fullmatch(name)
    if found and read_manifest(parent) is not None:
        raise UserError(f"--model_dir={model_dir} is seed {found.group(1)} of the multi-seed "
                        f"run in {parent}; resume it with --seeds={found.group(1)} "
                        f"--model_dir={parent}")


def check_multi_seed_dir(model_dir: str, config: dict) -> dict | None:
    """Checks that MODEL_DIR can hold this multi-seed run; returns its manifest, if any.

    Args:
      model_dir: the parent directory (may not exist yet).
      config: the run's configuration (JSON values): every seed of one run shares it.

    Raises:
      UserError: MODEL_DIR holds a single-seed run's model, or a multi-seed run with another
        configuration (the first differing key is named).
    """
    manifest = read_manifest(model_dir)
    if manifest is None:
        if outputs.is_model_dir(model_dir):
            raise UserError(f"--model_dir={model_dir} holds a single-seed finetune run "
                            "(bert_train.json, checkpoints); a multi-seed run needs its own "
                            "--model_dir (or drop --seeds/--num_seeds to resume that run)")
        return None
    stored = manifest.get("config", {})
    for key in sorted(set(stored) | set(config)):
        if stored.get(key) != config.get(key):
            raise UserError(f"--model_dir={model_dir} is a multi-seed run with {key}="
                            f"{stored.get(key)!r}; this run asks for {key}={config.get(key)!r}; "
                            "the seeds of one run share one configuration: use another "
                            "--model_dir")
    return manifest
