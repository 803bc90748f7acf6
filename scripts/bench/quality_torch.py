"""The PyTorch system of the pretraining-quality benchmark (run in a PyTorch interpreter).

`BertForMaskedLM` trained by transformers' `Trainer` with the recipe of transformers' own
`examples/pytorch/language-modeling/run_mlm.py`: dynamic masking by
`DataCollatorForLanguageModeling` (15 %, 80/10/10), AdamW (betas 0.9/0.999, epsilon 1e-8,
weight decay 0), a linear schedule, gradients clipped at 1.0. Changed from its defaults, as
wrong for a from-scratch model trained for minutes: the peak learning rate (its 5e-5 is a
fine-tuning rate; `learning_rate`), a 10 % warmup (none by default; a post-norm BERT at the
larger rate needs one), the batch (`batch_size`, the other systems' batch) and `max_steps`
(from the time budget). It reads the benchmark's token sequences (train.npz), not text, so
every system sees the same tokens.

    python quality_torch.py PARAMS.json RESULT.json

PARAMS: train_npz, vocab_file, vocab_size, sizes (hidden_size, num_layers,
num_attention_heads, inner_dim, max_sequence_length), batch_size, learning_rate, seed,
launched (the launch's epoch seconds: budgets count from it), budgets_s (snapshot times),
max_steps, out_dir, and calibrate_steps (when set: train that many steps, report the step rate
and save nothing). RESULT: {"steps_per_s"} or {"snapshots": [{"seconds", "step", "dir"}]}.
Each snapshot is a Hugging Face directory (config.json, model.safetensors, vocab.txt).
"""

import json
import os
import shutil
import sys
import time


def main(params_file: str, result_file: str) -> int:
    with open(params_file) as f:
        p = json.load(f)
    import numpy as np
    import torch
    import transformers

    torch.set_num_threads(os.cpu_count() or 1)
    transformers.set_seed(p["seed"])
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

    collator = transformers.DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15)
    calibrate = p.get("calibrate_steps")
    budgets = sorted(p.get("budgets_s", []))
    snapshots = []
    marks = {}

    class Snapshots(transformers.TrainerCallback):
        """Saves the model when a budget's time is up; stops after the last budget."""

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 5:
                marks["start"] = (time.time(), state.global_step)
            elapsed = time.time() - p["launched"]
            while budgets and elapsed >= budgets[0]:
                save(budgets.pop(0), state.global_step, elapsed)
            if not budgets and not calibrate:
                control.should_training_stop = True
            return control

    def save(seconds, step, elapsed):
        out = os.path.join(p["out_dir"], f"snapshot-{seconds:g}s")
        model.save_pretrained(out, safe_serialization=True)
        shutil.copy(p["vocab_file"], os.path.join(out, "vocab.txt"))
        snapshots.append({"seconds": seconds, "step": step, "dir": out, "elapsed": elapsed})

    steps = calibrate or p["max_steps"]
    args = transformers.TrainingArguments(
        output_dir=os.path.join(p["out_dir"], "trainer"), max_steps=steps,
        per_device_train_batch_size=p["batch_size"], learning_rate=p["learning_rate"],
        warmup_steps=max(1, steps // 10), lr_scheduler_type="linear", weight_decay=0.0,
        max_grad_norm=1.0, logging_steps=50, save_strategy="no", report_to=[],
        dataloader_num_workers=0, seed=p["seed"], use_cpu=True, disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Sequences(),
                                   data_collator=collator, callbacks=[Snapshots()])
    trainer.train()
    elapsed = time.time() - p["launched"]
    while budgets and not calibrate:  # the run ended first: its final model is the snapshot
        save(budgets.pop(0), trainer.state.global_step, elapsed)
    if calibrate:
        start, first = marks["start"]
        result = {"steps_per_s": (calibrate - first) / (time.time() - start)}
    else:
        result = {"snapshots": snapshots, "steps": trainer.state.global_step}
    with open(result_file, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
