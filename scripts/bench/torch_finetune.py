"""The PyTorch + transformers fine-tuning loop the `finetune` section compares bert-train with.

The usual loop of a transformers user, with dynamic padding: the examples tokenized once up
front (truncated to the sequence length, not padded), a `DataLoader` whose collator pads each
batch to its longest sequence (`DataCollatorWithPadding`; `DataCollatorForTokenClassification`
for tagging, which pads the labels with -100 too), `AutoModelForSequenceClassification` /
`AutoModelForTokenClassification` from the same pretrained directory (MiniLM), AdamW without
decay on biases and LayerNorm weights, the linear warmup and decay schedule, gradients clipped
to global norm 1.0, one optimizer step per batch. Learning rate, warmup, weight decay,
epsilon, clipping and dropout are bert-train's (passed in by the harness).

It trains the raw examples bert-train's task wrote (`finetune_step.write_examples`), in that
order. Runs in an interpreter that has torch and transformers (bert-train depends on neither):
`scripts/benchmark.py --torch_python=...`. It imports nothing from TensorFlow or bert-train.
"""

import json
import os


class NotAvailable(RuntimeError):
    """torch or transformers cannot be imported here; the harness skips the row."""


def torch_imports():
    try:
        import torch
        import transformers
    except ImportError as e:
        raise NotAvailable(f"not measured: torch/transformers not importable ({e})") from None
    return torch, transformers


def read_examples(path: str) -> list[dict]:
    """The JSON-lines raw examples bert-train's task wrote."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def tokenize(tokenizer, examples: list[dict], family: str, seq_length: int) -> list[dict]:
    """Tokenized, truncated, unpadded features, one dict per example (the collator pads).

    Classification: `tokenizer(text[, text_b])` + "labels". Tagging: the words as
    pre-split input; each word's tag on its first piece, -100 on the others and on [CLS],
    [SEP] (transformers' token-classification recipe).
    """
    out = []
    if family == "tagging":
        for example in examples:
            encoded = tokenizer(example["tokens"], is_split_into_words=True, truncation=True,
                                max_length=seq_length)
            labels, previous = [], None
            for word in encoded.word_ids():
                labels.append(-100 if word is None or word == previous
                              else example["tags"][word])
                previous = word
            out.append({**encoded, "labels": labels})
        return out
    for example in examples:
        texts = [example["text"]] + ([example["text_b"]] if "text_b" in example else [])
        encoded = tokenizer(*texts, truncation=True, max_length=seq_length)
        out.append({**encoded, "labels": example["label"]})
    return out


def adamw(torch, model, learning_rate: float, weight_decay: float, epsilon: float):
    """AdamW with no decay on biases and LayerNorm weights (two parameter groups)."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        skip = name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name
        (no_decay if skip else decay).append(param)
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=learning_rate, betas=(0.9, 0.999), eps=epsilon)


def build(*, model_dir: str, examples_file: str, family: str, label_names: list,
          seq_length: int, batch_size: int, train_steps: int, learning_rate: float,
          warmup_steps: int, weight_decay: float, epsilon: float, clip_norm: float | None,
          dropout_rate: float, threads: int | None = None, seed: int = 0):
    """Model, optimizer, data loader and run(n); worker entry point.

    Args:
      model_dir: the pretrained Hugging Face directory (the one bert-train starts from).
      examples_file: raw examples from `finetune_step.write_examples`.
      family: "classification" or "tagging".
      label_names: class (tag) names in id order.
      seq_length: truncation length.
      batch_size: examples per step.
      train_steps, learning_rate, warmup_steps, weight_decay, epsilon, clip_norm,
        dropout_rate: bert-train's settings for the same run.
      threads: torch intra-op threads; None: every core this process may use.
      seed: torch seed (head initialization, dropout).

    Returns:
      (info, run): run(n) trains n steps and returns the examples, real tokens and token
      slots (padding included) it trained on and the last loss.
    """
    torch, transformers = torch_imports()
    torch.manual_seed(seed)
    torch.set_num_threads(threads or len(os.sched_getaffinity(0)))
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    kwargs = dict(num_labels=len(label_names), hidden_dropout_prob=dropout_rate,
                  classifier_dropout=dropout_rate)
    if family == "tagging":
        model = transformers.AutoModelForTokenClassification.from_pretrained(model_dir, **kwargs)
        collator = transformers.DataCollatorForTokenClassification(tokenizer)
    elif family == "classification":
        model = transformers.AutoModelForSequenceClassification.from_pretrained(model_dir,
                                                                                **kwargs)
        collator = transformers.DataCollatorWithPadding(tokenizer)
    else:
        raise ValueError(f"family {family!r}: the baseline trains classification and tagging")
    model.train()
    features = tokenize(tokenizer, read_examples(examples_file), family, seq_length)
    if len(features) < batch_size:
        raise ValueError(f"{len(features)} examples are fewer than one batch of {batch_size}")
    loader = torch.utils.data.DataLoader(features, batch_size=batch_size, shuffle=False,
                                         collate_fn=collator, drop_last=True)
    optimizer = adamw(torch, model, learning_rate, weight_decay, epsilon)
    schedule = transformers.get_linear_schedule_with_warmup(optimizer, warmup_steps,
                                                            train_steps)
    batches = iter(())

    def next_batch():
        nonlocal batches
        batch = next(batches, None)
        if batch is None:  # The next epoch, in the same order.
            batches = iter(loader)
            batch = next(batches)
        return batch

    def run(num_steps: int) -> dict:
        examples = tokens = slots = 0
        loss = None
        for _ in range(num_steps):
            batch = next_batch()
            mask = batch["attention_mask"]
            examples += mask.shape[0]
            tokens += int(mask.sum())
            slots += mask.numel()
            loss = model(**batch).loss
            loss.backward()
            if clip_norm:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
        # CPU ops are synchronous: item() returns once the last step is done.
        return {"examples": examples, "tokens": tokens, "token_slots": slots,
                "loss": loss.detach().item()}

    return {"params": sum(p.numel() for p in model.parameters()),
            "examples_read": len(features), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "transformers": transformers.__version__,
            "attention": getattr(model.config, "_attn_implementation", None)}, run
