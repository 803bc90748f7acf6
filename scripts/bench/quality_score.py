"""Scores a pretraining snapshot: masked-LM accuracy on held-out text, SST-2 after fine-tuning.

Every system's snapshot is a bert-train checkpoint prefix or a Hugging Face directory, which
bert-train reads alike (`interop.resolve`), so one scorer and one fine-tuning command serve all.

- masked-LM accuracy: the snapshot's encoder and masked-LM head on eval.npz (held-out reviews
  masked once, the same positions for every system): the weighted share of masked tokens
  whose highest logit is the original token.
- SST-2: `bert-train finetune --task=sst2 --seeds=...` with one fixed recipe for every system
  (the same steps, rate, batch, sequence length, and encoder dropout 0.1 whatever the snapshot
  was pretrained with: FinetuneConfig.encoder_dropout); dev accuracy per seed from its
  MODEL_DIR/eval_results.json. `none` fine-tunes the same encoder from random weights.
"""

import dataclasses
import json
import os
import pathlib
import statistics
import subprocess
import sys

import numpy as np

REPO = pathlib.Path(__file__).resolve().parents[2]


@dataclasses.dataclass(frozen=True)
class FinetuneRecipe:
    train_file: str
    eval_file: str
    steps: int
    learning_rate: float
    batch_size: int
    seq_length: int
    seeds: tuple[int, ...]


def mlm_accuracy(snapshot: str | None, eval_npz: str, *, sizes: dict | None = None,
                 vocab_size: int | None = None, batch_size: int = 256) -> float:
    """Masked-LM accuracy of a snapshot (None: a randomly initialized post-norm encoder of
    `sizes`) on the masked examples of `eval_npz`."""
    import keras  # noqa: PLC0415

    from bert_trainer import features as F  # noqa: PLC0415
    from bert_trainer.encoders import BertEncoder  # noqa: PLC0415
    from bert_trainer.interop import resolve  # noqa: PLC0415
    from bert_trainer.models import BertPretrainer  # noqa: PLC0415

    if snapshot is None:
        keras.utils.set_random_seed(0)
        encoder = BertEncoder(vocab_size, **sizes)
        model = BertPretrainer(encoder, num_next_sentence_labels=0)
    else:
        checkpoint = resolve.resolve_checkpoint(snapshot)
        model = BertPretrainer(checkpoint.build_encoder(), num_next_sentence_labels=0)
        report = checkpoint.load(encoder=model.encoder, masked_lm=model.masked_lm)
        missing = [n for n in report["initialized"] if "masked_lm" in n or "encoder" in n]
        if missing:
            raise RuntimeError(f"{snapshot}: no trained weights for {missing[:3]}")
    arrays = np.load(eval_npz)
    names = (*F.ENCODER_INPUTS, F.MASKED_LM_POSITIONS)
    correct = total = 0.0
    for start in range(0, len(arrays[names[0]]), batch_size):
        batch = {n: arrays[n][start:start + batch_size] for n in names}
        logits = model(batch, training=False)[F.MLM_LOGITS].numpy()  # (batch, P, vocab)
        weights = arrays[F.MASKED_LM_WEIGHTS][start:start + batch_size]
        hits = logits.argmax(-1) == arrays[F.MASKED_LM_IDS][start:start + batch_size]
        correct += float((hits * weights).sum())
        total += float(weights.sum())
    keras.backend.clear_session()
    return correct / total


def finetune_command(snapshot: str | None, recipe: FinetuneRecipe, model_dir: str, *,
                     vocab_file: str, scratch_bindings: list[str]) -> list[str]:
    """`bert-train finetune` for SST-2 from `snapshot` (None: from random weights)."""
    command = [sys.executable, "-m", "bert_trainer.cli", "finetune", "--task=sst2",
               f"--train_file={recipe.train_file}", f"--eval_file={recipe.eval_file}",
               f"--model_dir={model_dir}", f"--seq_length={recipe.seq_length}",
               f"--batch_size={recipe.batch_size}", f"--learning_rate={recipe.learning_rate}",
               f"--train_steps={recipe.steps}", f"--seeds={','.join(map(str, recipe.seeds))}",
               "--gin_param=FinetuneConfig.encoder_dropout = 0.1"]
    if snapshot is None:
        command += [f"--vocab_file={vocab_file}", "--gin_file=configs/encoders/base.gin",
                    *(f"--gin_param={b}" for b in scratch_bindings)]
    else:
        command.append(f"--init_checkpoint={snapshot}")
    return command


def sst2_accuracy(snapshot: str | None, recipe: FinetuneRecipe, model_dir: str, *,
                  vocab_file: str, scratch_bindings: list[str], log_file: str) -> dict:
    """{"mean", "std", "seeds": [per-seed dev accuracy]} of fine-tuning `snapshot`."""
    command = finetune_command(snapshot, recipe, model_dir, vocab_file=vocab_file,
                               scratch_bindings=scratch_bindings)
    with open(log_file, "w") as log:
        code = subprocess.run(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT).returncode
    if code:
        raise RuntimeError(f"fine-tuning {snapshot or 'from scratch'} failed ({code}); see "
                           f"{log_file}")
    with open(os.path.join(model_dir, "eval_results.json"), encoding="utf-8") as f:
        runs = json.load(f)["runs"]
    by_seed = {int(r["seed"]): float(r["metrics"]["accuracy"]) for r in runs}
    values = [by_seed[s] for s in recipe.seeds]
    return {"mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else None, "seeds": values}
