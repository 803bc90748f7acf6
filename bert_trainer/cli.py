"""`bert-train` command line: dispatches `bert-train SUBCOMMAND [--flags]` to a module.

Each subcommand lives in `bert_trainer/commands/<name>.py`, defines its absl flags at import
time and a `main(argv)`. Only the chosen module is imported, so each subcommand sees only
its own flags and `--help` is fast.
"""

import importlib
import os
import sys

SUBCOMMANDS = {
    "pretrain": "Pretrain a BERT encoder (masked LM + next sentence) from a gin config.",
    "finetune": "Fine-tune an encoder on a task (classification, QA, tagging).",
    "evaluate": "Evaluate a model directory on a task's eval split.",
    "predict": "Run a trained model or exported SavedModel over text.",
    "export": "Export a text-in SavedModel for serving.",
    "convert": "Convert Hugging Face / Google BERT checkpoints to and from bert-train.",
    "vocab": "Learn a WordPiece vocabulary from text files.",
    "create_pretraining_data": "Write sentence-pair pretraining TFRecords from text.",
}


def _usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    lines = ["usage: bert-train SUBCOMMAND [--flags]   (bert-train SUBCOMMAND --help for its flags)", "",
             "subcommands:"]
    lines += [f"  {name:<{width}}  {text}" for name, text in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = list(sys.argv if argv is None else argv)
    if len(argv) < 2 or argv[1] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    name = argv[1]
    if name not in SUBCOMMANDS:
        print(f"bert-train: unknown subcommand '{name}'; choose one of: {', '.join(SUBCOMMANDS)}",
              file=sys.stderr)
        return 2
    # Quiet TensorFlow's C++ start-up logs before anything imports it.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from bert_trainer.commands import run_command  # noqa: PLC0415 (keeps --help free of TF)

    module = importlib.import_module(f"bert_trainer.commands.{name}")
    return run_command(module, [f"bert-train {name}"] + argv[2:])


if __name__ == "__main__":
    sys.exit(main())
