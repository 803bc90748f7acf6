"""`make demo`'s summary: what the run did, from its event files and results, as JSON and text.

`summarize` gathers the numbers (steps, first and last losses, held-out metrics, predictions,
stage timings, paths) into the dict written to WORKDIR/summary.json; `print_summary` prints
it; `plot` draws the loss curves PNG.
"""

import json
import os
import sys

from bert_trainer.demo import plotting
from bert_trainer.demo import task as demo_task
from bert_trainer.errors import UserError


def _first_last(scalars: dict, tag: str) -> dict | None:
    """The first and last logged values of a training loss.

    Each is the mean over the steps since the previous summary: `first` over steps
    1..first_step, `last` over last_window_start..last_step.
    """
    if tag not in scalars:
        return None
    steps, values = scalars[tag]
    return {"first_step": steps[0], "first": values[0], "last_step": steps[-1],
            "last_window_start": steps[-2] + 1 if len(steps) > 1 else 1, "last": values[-1]}


def _scalars(model_dir: str, split: str) -> dict:
    """{tag: (steps, values)} of a run's train or eval events; {} when it logged none."""
    try:
        return plotting.read_scalars(os.path.join(model_dir, split))
    except UserError:  # No events (a run that logged nothing yet): nothing to report.
        return {}


def summarize(p: dict, task: demo_task.DemoTask, sentences, timings: list[dict],
              wall: float) -> dict:
    """Everything the summary shows, as JSON-ready data (written to summary.json).

    Args:
      p: the demo's paths (`demo.paths`).
      task: the fine-tuning task.
      sentences: the predicted sentences, (text, the label a reader expects) pairs, in the
        order of the predictions file.
      timings: one dict per stage (stage, seconds, cpu_seconds, status).
      wall: the whole run's seconds.

    Returns:
      The summary dict.
    """
    pretrain, finetune, scratch = {}, {}, {}
    for out, model_dir, tags in ((pretrain, p["pretrain"], ("loss", "mlm_loss", "nsp_loss")),
                                 (finetune, p["finetune"], ("loss",)),
                                 (scratch, p["finetune_scratch"], ("loss",))):
        train, evals = _scalars(model_dir, "train"), _scalars(model_dir, "eval")
        out["steps"] = max((s[0][-1] for s in train.values()), default=0)
        out["train"] = {tag: _first_last(train, tag) for tag in tags}
        out["eval"] = {tag: values[-1] for tag, (_, values) in sorted(evals.items())}
    with open(os.path.join(p["finetune"], "eval_results.json"), encoding="utf-8") as f:
        results = json.load(f)
    # The from-scratch run's own evaluation at its last step (its last weights, as the
    # evaluate stage reads the pretrained run's).
    with open(os.path.join(p["finetune_scratch"], "eval_results.json"), encoding="utf-8") as f:
        scratch_results = json.load(f)
    with open(p["predictions"], encoding="utf-8") as f:
        answers = [json.loads(line) for line in f if line.strip()]
    predictions = [{"text": a["text"], "label": a["label"], "expected": expected,
                    "probability": max(a["probabilities"])}
                   for a, (_, expected) in zip(answers, sentences, strict=True)]
    return {
        "task": {"question": "which standard-library package does a docstring sentence "
                             "come from", "labels": list(task.label_names),
                 "train_examples": sum(task.train_counts.values()),
                 "dev_examples": sum(task.dev_counts.values()),
                 "dev_modules": task.dev_modules},
        "pretrain": pretrain, "finetune": finetune, "finetune_scratch": scratch,
        "dev": {"accuracy": results["metrics"].get("accuracy"),
                "from_scratch_accuracy": scratch_results["metrics"].get("accuracy"),
                "from_scratch_step": scratch_results.get("step"),
                "num_examples": results["metrics"].get("num_examples"),
                "checkpoint": results.get("checkpoint"), "step": results.get("step"),
                "majority_baseline": task.majority_accuracy,
                "majority_label": task.majority_label},
        "predictions": predictions,
        "stages": timings,
        "wall_seconds": round(wall, 1),
        "paths": dict(p),
        "tensorboard": f"tensorboard --logdir {os.path.dirname(p['summary']) or '.'}",
    }


def plot(p: dict, summary: dict) -> str | None:
    """Draws the loss curves PNG; None (with a warning) when matplotlib is missing."""
    pre_train, pre_eval = _scalars(p["pretrain"], "train"), _scalars(p["pretrain"], "eval")
    ft_train, ft_eval = _scalars(p["finetune"], "train"), _scalars(p["finetune"], "eval")
    sc_train = _scalars(p["finetune_scratch"], "train")
    sc_eval = _scalars(p["finetune_scratch"], "eval")
    curve = lambda label, runs, tag, style="-": plotting.Curve(  # noqa: E731
        label, *runs.get(tag, ((), ())), style=style)
    panels = [
        plotting.Panel("Pretraining: BERT-Tiny on stdlib docstrings", (
            curve("train MLM loss", pre_train, "mlm_loss"),
            curve("held-out MLM loss", pre_eval, "mlm_loss", "o--"),
            curve("train NSP loss", pre_train, "nsp_loss"),
            curve("held-out NSP loss", pre_eval, "nsp_loss", "o--"))),
        plotting.Panel("Fine-tuning: which package?", (
            curve("train loss, pretrained", ft_train, "loss"),
            curve("dev loss, pretrained", ft_eval, "loss", "o--"),
            curve("train loss, from random weights", sc_train, "loss", ":"),
            curve("dev loss, from random weights", sc_eval, "loss", "o:"))),
        plotting.Panel("Fine-tuning: dev accuracy (held-out modules)", (
            curve("pretrained encoder", ft_eval, "accuracy", "o-"),
            curve("same encoder, random weights", sc_eval, "accuracy", "o:")),
            ylabel="accuracy", ylim=(0.0, 1.0), references=(
                (f"majority baseline ({summary['dev']['majority_baseline']:.1%})",
                 summary["dev"]["majority_baseline"]),)),
    ]
    try:
        return plotting.plot_panels(panels, p["plot"], title="bert-train demo")
    except UserError as e:
        print(f"demo: warning: no loss-curve PNG: {e}", file=sys.stderr)
        return None


def print_summary(summary: dict) -> None:
    """Prints the summary made by `summarize` (steps, losses, metric, stages, paths)."""
    pre, ft, dev = summary["pretrain"], summary["finetune"], summary["dev"]
    lines = ["", "=" * 78, "bert-train demo: summary", "=" * 78]
    for name, run in (("pretrain", pre), ("finetune", ft),
                      ("scratch", summary["finetune_scratch"])):
        lines.append(f"{name:<9} {run['steps']} steps; mean train losses, first -> last window:")
        lines += [f"{'':<11}{tag:<9} {v['first']:.3f} (steps 1-{v['first_step']}) -> "
                  f"{v['last']:.3f} (steps {v['last_window_start']}-{v['last_step']})"
                  for tag, v in run["train"].items() if v]
    held = ", ".join(f"{k} {v:.3f}" for k, v in pre["eval"].items()
                     if k in ("mlm_loss", "mlm_accuracy", "nsp_accuracy"))
    lines.append(f"{'':<9} held-out pretraining text: {held}")
    lines.append(f"dev       accuracy {dev['accuracy']:.1%} on {dev['num_examples']:.0f} "
                 f"sentences of held-out modules (step {dev['step']}, last checkpoint) vs "
                 f"majority baseline {dev['majority_baseline']:.1%} ('{dev['majority_label']}')")
    gain = dev["accuracy"] - dev["from_scratch_accuracy"]
    lines.append(f"{'':<9} the same fine-tune from random weights: "
                 f"{dev['from_scratch_accuracy']:.1%} (step {dev['from_scratch_step']}): "
                 f"pretraining {'bought' if gain > 0 else 'lost'} {abs(gain):.1%} "
                 "(one seed each)")
    lines.append("predict   (sentences written for the demo; expected = a reader's guess)")
    for row in summary["predictions"]:
        mark = "ok" if row["label"] == row["expected"] else "  "
        lines.append(f"  {mark} {row['label']:<9} {row['probability']:.2f}  "
                     f"(expected {row['expected']:<9}) {row['text']}")
    ran = [s for s in summary["stages"] if s["status"] == "ran"]
    lines.append("stages    seconds wall / CPU: " + ", ".join(
        f"{s['stage']} {s['seconds']:.0f}/{s['cpu_seconds']:.0f}" if s["status"] == "ran"
        else f"{s['stage']} reused" for s in summary["stages"])
        + f"; total {summary['wall_seconds']:.0f}s wall, "
        f"{sum(s['cpu_seconds'] for s in ran):.0f}s CPU")
    lines.append("outputs")
    for key in ("pretrain", "finetune", "finetune_scratch", "export", "predictions", "plot",
                "summary", "logs"):
        lines.append(f"  {key:<16} {summary['paths'][key] or '(none: see the warning above)'}")
    lines.append(f"TensorBoard  {summary['tensorboard']}")
    print("\n".join(lines), flush=True)
