"""`bert-train` command line: dispatches `bert-train SUBCOMMAND [--flags]` to a module.

Each subcommand lives in `bert_trainer/commands/<name>.py`, defines its absl flags at import
time and a `main(argv)`. Only the chosen module is imported, so `--help` is fast. A flag that
several subcommands take is defined once (`commands/shared_flags.py`), so any number of them can
also be imported into one process (tests, notebooks); each accepts only its own flags.
"""

import contextlib
import gc
import importlib
import os
import sys
import tempfile

SUBCOMMANDS = {
    "pretrain": "Pretrain a BERT encoder (masked LM) or a GPT-style causal LM from gin.",
    "finetune": "Fine-tune an encoder on a task (classification, QA, tagging).",
    "evaluate": "Evaluate a model directory on a task's eval split.",
    "predict": "Run a trained model or exported SavedModel over text.",
    "generate": "Continue prompts with a causal language model (or its export).",
    "export": "Export a text-in SavedModel for serving.",
    "convert": "Convert Hugging Face / Google BERT checkpoints to and from bert-train.",
    "vocab": "Learn a WordPiece vocabulary from text files.",
    "create_pretraining_data": "Write pretraining TFRecords (sentence pairs or causal blocks).",
    "doctor": "Show what a run here will use: TensorFlow, CPU features, fused kernels, devices.",
}


def _usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    lines = ["usage: bert-train SUBCOMMAND [--flags]",
             "       (bert-train SUBCOMMAND --help lists its flags)", "", "subcommands:"]
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
    verbose = any(a in ("--verbose", "--verbose=true") for a in argv[2:])
    # Quiet TensorFlow's C++ logs before anything imports it. Without --verbose even its
    # ERROR lines go (e.g. "oneDNN supports DT_INT64 only on platforms with AVX-512" on every
    # CPU run): a real failure reaches bert-train as a Python exception and is reported there.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "0" if verbose else "3")
    from bert_trainer.commands import run_command  # noqa: PLC0415 (keeps --help free of TF)

    with _native_stderr_silenced(enabled=not verbose):
        import tensorflow as tf  # noqa: PLC0415  (every command needs it; load it quietly)
        import tensorflow_text  # noqa: F401, PLC0415  (registers its ops; loads its own .so)

        # Device discovery logs "failed call to cuInit" on machines without a GPU driver.
        tf.config.list_physical_devices()

        module = importlib.import_module(f"bert_trainer.commands.{name}")
    # TensorFlow's and Keras' objects (about a million) live as long as the process: frozen
    # out of the garbage collector, whose collections then walk only what the command makes.
    # Once per process: a later command in the same process (a notebook, the demo's batch)
    # must not freeze what the one before left for collection.
    if not gc.get_freeze_count():
        gc.freeze()
    from bert_trainer import ops  # noqa: PLC0415

    try:
        ops.default_mode()  # a bad BERT_TRAIN_FUSED_KERNELS stops here, not in a traced step
    except ValueError as e:
        print(f"bert-train: {e}", file=sys.stderr)
        return 2
    return run_command(module, [f"bert-train {name}"] + argv[2:])


@contextlib.contextmanager
def _native_stderr_silenced(enabled: bool = True):
    """Holds back what native code writes to fd 2 while TensorFlow loads.

    TensorFlow's C++ start-up lines ("oneDNN custom operations are on", "Could not find cuda
    drivers") are written by absl before its logging is initialised, so TF_CPP_MIN_LOG_LEVEL
    cannot silence them and they would bury bert-train's one-line messages. If the import
    fails, what was held back is written out after all.
    """
    if not enabled:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        ok = False
        try:
            yield
            ok = True
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            if not ok:
                held.seek(0)
                sys.stderr.write(held.read().decode(errors="replace"))


if __name__ == "__main__":
    sys.exit(main())
