"""PyTorch + transformers baseline of the "mini" pretraining step, measured on this machine.

The PyTorch figures quoted for this step (18 seq/s eager, 19 compiled) were taken elsewhere;
this script measures the same step here so bert-train can be compared under the same
conditions. It is standalone and needs torch + transformers, which bert-train itself never imports:

    /work/hfenv/bin/python scripts/bench/torch_baseline.py --variants=eager,compiled

What it trains matches `scripts/bench/keras_hub_step.py` (see benchmarks/README.md):
transformers' `BertModel` (L4/H256/A4, inner 1024, vocab 30,522, 512 positions, 2 segment
types, dropout 0.1, exact GELU), a BertLMPredictionHead-style masked-LM head (dense + GELU +
LayerNorm, decoder tied to the word embeddings, own bias) applied only at the 20 gathered
positions, NSP dense on the pooled output; AdamW (lr 1e-4, weight decay 0.01 except biases and
LayerNorm, eps 1e-6), gradients clipped to global norm 1.0; batch 32 x sequence 128; the same
4 `spec.make_batches` batches cycled. The parameter count is checked against `spec.num_params`.

Variants are all built in one process and timed in alternating rounds (A/B/A/B) after warm-up;
the result is printed as one JSON object (and written to --output if given).

The fine-tuning loop with dynamic padding that `scripts/benchmark.py --only=finetune` runs
against bert-train is its sibling, `torch_finetune.py`.
"""

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

import numpy as np
import torch
import transformers
from torch import nn
from torch.nn import functional as F

# spec.py is numpy-only (its one import, bert_trainer.features, is string constants).
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
from bert_trainer import features  # noqa: E402
from scripts.bench import spec as spec_lib  # noqa: E402

LEARNING_RATE = 1e-4
WEIGHT_DECAY = 0.01
CLIP_NORM = 1.0
NUM_DATA_BATCHES = spec_lib.NUM_DATA_BATCHES
VARIANTS = ("eager", "compiled", "eager_bf16", "compiled_bf16")


class Pretrainer(nn.Module):
    """BertModel + gathered masked-LM head (tied decoder) + NSP head; forward returns the loss."""

    def __init__(self, size: spec_lib.ModelSize):
        super().__init__()
        config = transformers.BertConfig(
            vocab_size=size.vocab_size, hidden_size=size.hidden_size,
            num_hidden_layers=size.num_layers, num_attention_heads=size.num_attention_heads,
            intermediate_size=size.inner_dim, hidden_act="gelu", hidden_dropout_prob=0.1,
            attention_probs_dropout_prob=0.1,
            max_position_embeddings=spec_lib.MAX_SEQUENCE_LENGTH,
            type_vocab_size=spec_lib.TYPE_VOCAB_SIZE, layer_norm_eps=1e-12)
        self.bert = transformers.BertModel(config, add_pooling_layer=True)
        h = size.hidden_size
        # BertLMPredictionHead: transform (dense, GELU, LayerNorm), then the tied decoder + bias.
        self.mlm_dense = nn.Linear(h, h)
        self.mlm_norm = nn.LayerNorm(h, eps=1e-12)
        self.mlm_bias = nn.Parameter(torch.zeros(size.vocab_size))
        self.nsp = nn.Linear(h, 2)

    def forward(self, batch: dict) -> torch.Tensor:
        """Scalar loss: weighted MLM cross-entropy (mean over real predictions) + NSP CE.

        Args:
          batch: features names -> tensors; ids/mask/type [b, s], MLM [b, P], NSP labels [b].
        """
        out = self.bert(input_ids=batch[features.INPUT_WORD_IDS],
                        attention_mask=batch[features.INPUT_MASK],
                        token_type_ids=batch[features.INPUT_TYPE_IDS])
        sequence = out.last_hidden_state  # (b, s, h)
        positions = batch[features.MASKED_LM_POSITIONS]  # (b, P)
        index = positions.unsqueeze(-1).expand(-1, -1, sequence.shape[-1])
        gathered = torch.gather(sequence, 1, index)  # (b, P, h): only the masked positions
        x = self.mlm_norm(F.gelu(self.mlm_dense(gathered)))
        logits = F.linear(x, self.bert.embeddings.word_embeddings.weight, self.mlm_bias)
        mlm = F.cross_entropy(logits.float().flatten(0, 1),
                              batch[features.MASKED_LM_IDS].flatten(), reduction="none")
        weights = batch[features.MASKED_LM_WEIGHTS].flatten()
        mlm_loss = (mlm * weights).sum() / weights.sum().clamp(min=1.0)
        nsp_loss = F.cross_entropy(self.nsp(out.pooler_output).float(),
                                   batch[features.NEXT_SENTENCE_LABELS])
        return mlm_loss + nsp_loss


def make_optimizer(model: nn.Module) -> torch.optim.AdamW:
    """AdamW as BERT uses it: no weight decay on biases and LayerNorm parameters."""
    norm_params = {id(p) for m in model.modules() if isinstance(m, nn.LayerNorm)
                   for p in m.parameters()}
    decay, no_decay = [], []
    for name, param in model.named_parameters():  # Tied weights are listed once.
        skip = name.endswith("bias") or id(param) in norm_params
        (no_decay if skip else decay).append(param)
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": WEIGHT_DECAY},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=LEARNING_RATE, betas=(0.9, 0.999), eps=1e-6)


def torch_batches(step: spec_lib.StepSpec) -> list[dict]:
    """`spec.make_batches` as torch tensors (int64 ids, as PyTorch embedding code expects)."""
    out = []
    for batch in spec_lib.make_batches(step, NUM_DATA_BATCHES):
        out.append({k: torch.from_numpy(v.astype(np.float32 if v.dtype == np.float32
                                                  else np.int64)) for k, v in batch.items()})
    return out


def build(step: spec_lib.StepSpec, variant: str):
    """Model, optimizer and a `run(n)` that trains n steps and returns the last loss."""
    torch.manual_seed(0)
    model = Pretrainer(step.size).train()
    params = sum(p.numel() for p in model.parameters())
    expected = spec_lib.num_params(step.size)
    if params != expected:
        raise SystemExit(f"parameter count {params:,} != spec.num_params {expected:,}")
    optimizer = make_optimizer(model)
    loss_fn = torch.compile(model) if variant.startswith("compiled") else model
    use_bf16 = variant.endswith("bf16")
    batches = torch_batches(step)
    counter = [0]

    def run(num_steps: int) -> float:
        loss = None
        for _ in range(num_steps):
            batch = batches[counter[0] % len(batches)]
            counter[0] += 1
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_bf16):
                loss = loss_fn(batch)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)
            optimizer.step()
        return loss.detach().item()  # CPU ops are synchronous; item() marks the end.

    return params, run


def measure(step: spec_lib.StepSpec, variants: list[str], warmup: int, steps: int,
            rounds: int) -> dict:
    """Builds and warms every variant, then times `rounds` alternating rounds of `steps` each."""
    runs, results = {}, {}
    for variant in variants:
        params, run = build(step, variant)
        start = time.perf_counter()
        loss = run(warmup)
        runs[variant] = run
        results[variant] = {"params": params, "warmup_s": round(time.perf_counter() - start, 2),
                            "round_step_s": [], "warmup_loss": loss}
    for _ in range(rounds):
        for variant in variants:
            start = time.perf_counter()
            results[variant]["last_loss"] = runs[variant](steps)
            results[variant]["round_step_s"].append(
                round((time.perf_counter() - start) / steps, 4))
    for r in results.values():
        r["median_step_s"] = statistics.median(r["round_step_s"])
        r["seq_per_s"] = round(step.batch_size / r["median_step_s"], 2)
        r["tokens_per_s"] = round(step.batch_size * step.seq_length / r["median_step_s"], 1)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default="eager,compiled",
                        help=f"comma list of {','.join(VARIANTS)}")
    parser.add_argument("--size", default="mini", choices=sorted(spec_lib.SIZES))
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per variant")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds")
    parser.add_argument("--output", help="also write the JSON here")
    args = parser.parse_args()
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"--variants: unknown {unknown}; choose from {','.join(VARIANTS)}")
    torch.set_num_threads(args.threads)
    step = spec_lib.StepSpec(spec_lib.SIZES[args.size])
    report = {
        "step": step.to_json(), "threads": torch.get_num_threads(),
        "torch": torch.__version__, "transformers": transformers.__version__,
        "load_avg_start": os.getloadavg()[0],
        "results": measure(step, variants, args.warmup, args.steps, args.rounds),
        "load_avg_end": os.getloadavg()[0],
    }
    text = json.dumps(report, indent=1)
    print(text)
    if args.output:
        pathlib.Path(args.output).write_text(text + "\n")


if __name__ == "__main__":
    main()
