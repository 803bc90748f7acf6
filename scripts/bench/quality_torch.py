"""The PyTorch system of the pretraining benchmarks (run in a PyTorch interpreter).

`BertForMaskedLM` trained by transformers' `Trainer` with the recipe of transformers' own
`examples/pytorch/language-modeling/run_mlm.py`: dynamic masking by
`DataCollatorForLanguageModeling` (15 %, 80/10/10), AdamW (betas 0.9/0.999, epsilon 1e-8,
weight decay 0), a linear schedule, gradients clipped at 1.0. Changed from its defaults: the
peak learning rate (`learning_rate`), a warmup (`warmup_fraction`, default 10 %; none by
default in run_mlm), the batch (`batch_size`, the other systems' batch) and the length of the
run: a wall-clock budget, as bert-train's `--time_budget` runs:

- the budget (`budget_s`) counts the training loop, from `Trainer`'s `on_train_begin` to the
  step that spends it; the start-up before it (imports, data, model) is not counted and is
  recorded (`startup`, seconds);
- the learning rate runs on the fraction of the budget spent: before each step it is set from
  `elapsed / budget` (linear warmup over `warmup_fraction`, then linear decay to 0 at the end
  of the budget), so the schedule ends with the budget whatever the step rate: no calibration;
- the run stops at the first step that ends past the budget and saves its model then.

It reads the benchmark's token sequences (train.npz), not text, so every system sees the same
tokens. The model starts from `init_dir` (a Hugging Face directory: continued pretraining)
when given, else from random weights of `sizes`.

    python quality_torch.py PARAMS.json RESULT.json

PARAMS: train_npz, vocab_file, batch_size, learning_rate, seed, budget_s, out_dir, and either
init_dir or vocab_size + sizes (hidden_size, num_layers, num_attention_heads, inner_dim,
max_sequence_length); optional warmup_fraction, launched (epoch seconds of the launch).
RESULT: {"seconds", "step", "dir", "elapsed" (launch to the saved model), "startup",
"loop_seconds"}; `dir` is a Hugging Face directory (config.json, model.safetensors, vocab.txt).
"""

import json
import os
import shutil
import sys
import time


def rate_factor(fraction: float, warmup_fraction: float) -> float:
    """The linear schedule on the fraction of the budget spent: warmup, then decay to 0."""
    if warmup_fraction > 0 and fraction < warmup_fraction:
        return fraction / warmup_fraction
    return max(0.0, (1.0 - fraction) / (1.0 - warmup_fraction))


def main(params_file: str, result_file: str) -> int:
    with open(params_file) as f:
        p = json.load(f)
    launched = p.get("launched", time.time())
    import numpy as np
    import torch
    import transformers

    torch.set_num_threads(os.cpu_count() or 1)
    transformers.set_seed(p["seed"])
    if p.get("init_dir"):
        model = transformers.BertForMaskedLM.from_pretrained(p["init_dir"])
    else:
        s = p["sizes"]
        config = transformers.BertConfig(
            vocab_size=p["vocab_size"], hidden_size=s["hidden_size"],
            num_hidden_layers=s["num_layers"], num_attention_heads=s["num_attention_heads"],
            intermediate_size=s["inner_dim"], max_position_embeddings=s["max_sequence_length"],
            type_vocab_size=2, hidden_act="gelu", layer_norm_eps=1e-12)
        model = transformers.BertForMaskedLM(config)
    tokenizer = transformers.BertTokenizerFast(vocab_file=p["vocab_file"], do_lower_case=True)
    arrays = np.load(p["train_npz"])
    ids, mask, types = (arrays[k] for k in ("input_word_ids", "input_mask", "input_type_ids"))

    class Sequences(torch.utils.data.Dataset):
        def __len__(self):
            return len(ids)

        def __getitem__(self, i):
            return {"input_ids": torch.from_numpy(ids[i].astype(np.int64)),
                    "attention_mask": torch.from_numpy(mask[i].astype(np.int64)),
                    "token_type_ids": torch.from_numpy(types[i].astype(np.int64))}

    budget, warmup = float(p["budget_s"]), float(p.get("warmup_fraction", 0.1))
    clock = {}

    def fraction() -> float:
        return 0.0 if "start" not in clock else min(1.0, (time.time() - clock["start"]) / budget)

    optimizer = torch.optim.AdamW(model.parameters(), lr=p["learning_rate"], betas=(0.9, 0.999),
                                  eps=1e-8, weight_decay=0.0)
    # LambdaLR sets each step's rate (after the previous optimizer step) from the clock.
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda _: rate_factor(fraction(), warmup))

    class Budget(transformers.TrainerCallback):
        """Starts the clock with the training loop; stops the run when the budget is spent."""

        def on_train_begin(self, args, state, control, **kwargs):
            clock["start"] = time.time()

        def on_step_end(self, args, state, control, **kwargs):
            if time.time() - clock["start"] >= budget:
                clock["end"] = time.time()
                control.should_training_stop = True
            return control

    args = transformers.TrainingArguments(
        output_dir=os.path.join(p["out_dir"], "trainer"), max_steps=10**9,
        per_device_train_batch_size=p["batch_size"], learning_rate=p["learning_rate"],
        max_grad_norm=1.0, logging_steps=50, save_strategy="no", report_to=[],
        dataloader_num_workers=0, seed=p["seed"], use_cpu=True, disable_tqdm=True)
    collator = transformers.DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Sequences(),
                                   data_collator=collator, callbacks=[Budget()],
                                   optimizers=(optimizer, scheduler))
    trainer.train()
    end = clock.get("end", time.time())
    out = os.path.join(p["out_dir"], f"snapshot-{budget:g}s")
    model.save_pretrained(out, safe_serialization=True)
    shutil.copy(p["vocab_file"], os.path.join(out, "vocab.txt"))
    for name in ("tokenizer_config.json", "special_tokens_map.json"):  # its casing
        if p.get("init_dir") and os.path.exists(os.path.join(p["init_dir"], name)):
            shutil.copy(os.path.join(p["init_dir"], name), os.path.join(out, name))
    result = {"seconds": budget, "step": trainer.state.global_step, "dir": out,
              "elapsed": time.time() - launched, "startup": clock["start"] - launched,
              "loop_seconds": end - clock["start"]}
    with open(result_file, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
