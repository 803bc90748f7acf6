"""`bert-train evaluate`: evaluate a fine-tuned model directory on its task's eval split.

  bert-train evaluate --model_dir=runs/sst2
  bert-train evaluate --model_dir=runs/sst2 --eval_file=SST-2/dev.tsv --checkpoint=best

The task, its labels, column mapping and sequence length come from model_dir/bert_train.json
(written by `finetune`); --eval_file / --data_dir say where the examples are (TFDS by
default). --checkpoint is "latest", "best" (kept by the eval metric during training), a step
or a checkpoint prefix in --model_dir. Prints the metrics and writes them, with the checkpoint
evaluated, to model_dir/eval_results-CKPT.json, CKPT naming the checkpoint (ckpt-1000,
best-ckpt-900; SQuAD also writes the answers to model_dir/eval_predictions-CKPT.json):
model_dir/eval_results.json is the fine-tuning run's own record, which evaluate never
replaces, and a run still training there may go on writing checkpoints (the one evaluated is
the one restored).
A model_dir this user cannot write (someone else's run, a read-only mount) is evaluated all the
same: the metrics are printed and a warning says which files were not written. A multi-seed
run's directory (`finetune --seeds`) holds one model per seed: evaluate
--model_dir=MODEL_DIR/seed-N (the parent is refused, naming them); MODEL_DIR/eval_results.json
already holds every seed's final metrics and their spread.
"""

import os
import sys

from absl import flags

from bert_trainer.commands import common, shared_flags
from bert_trainer.commands.shared_flags import Usage

flags.adopt_module_key_flags(common)
SHARED_FLAGS = {**common.SHARED_FLAGS, **shared_flags.declare(
    __name__,
    model_dir=Usage(None, "The model directory of a finetune run (holds bert_train.json)."),
    task=Usage(None, "Task name; default: the one stored in the model_dir."),
    family_module=Usage(None, "Comma-separated modules that register task families of your "
                        "own (plugins); a model_dir records its family's module, so this is "
                        "needed only where that module moved."),
    eval_file=Usage(None, "Local evaluation file; default: the task's TFDS validation split."),
    data_dir=Usage(None, "TFDS data directory holding the prepared dataset."),
    checkpoint=Usage("latest", "'latest', 'best', a step or a checkpoint prefix in --model_dir."),
    batch_size=Usage(32, "Global evaluation batch."),
    max_eval_examples=Usage(None, "Evaluate on the first N examples only."),
    skip_bad_rows=Usage(False, "Skip and count malformed rows instead of failing."))}

FLAGS = flags.FLAGS


def main(argv):
    del argv
    from bert_trainer.checkpoints import model_dir as model_dir_lib  # noqa: PLC0415 (imports TensorFlow)
    from bert_trainer.checkpoints import select  # noqa: PLC0415
    from bert_trainer.errors import UserError  # noqa: PLC0415
    from bert_trainer.runs import evaluation  # noqa: PLC0415
    from bert_trainer.tasks import finetuning, plugins  # noqa: PLC0415
    from bert_trainer.training import checkpoint_eval  # noqa: PLC0415

    common.setup_logging(FLAGS["verbosity"].present)
    if not FLAGS.model_dir:
        raise UserError("--model_dir is required: the model directory of a finetune run")
    model_dir = FLAGS.model_dir
    if "://" not in model_dir:
        model_dir = os.path.abspath(os.path.expanduser(model_dir))
    if not _isdir(model_dir):
        problem = "is a file" if os.path.isfile(model_dir) else "does not exist"
        raise UserError(f"--model_dir={model_dir} {problem}; pass the --model_dir of a "
                        "finetune run")
    shared_flags.check_input_files(eval_file=FLAGS.eval_file)
    # Remote file systems are taken as writable: their first write says otherwise.
    writable = "://" in model_dir or os.access(model_dir, os.W_OK | os.X_OK)
    info = model_dir_lib.read_model_info(model_dir)
    plugins.import_family_modules(FLAGS.family_module)
    data = finetuning.DataConfig(eval_file=FLAGS.eval_file, data_dir=FLAGS.data_dir,
                                 max_eval_examples=FLAGS.max_eval_examples,
                                 skip_bad_rows=FLAGS.skip_bad_rows)
    with common.one_line_errors():
        task = evaluation.evaluation_task(model_dir, info, FLAGS.task, data,
                                          batch_size=FLAGS.batch_size)
        prefix = select.select_checkpoint(model_dir, FLAGS.checkpoint)  # refuses a bad one
        # The latest is the one the evaluation restores (a live run moves it meanwhile).
        results, step, prefix = checkpoint_eval.evaluate_checkpoint(
            task, model_dir, None if FLAGS.checkpoint == select.LATEST else prefix,
            strategy=common.get_strategy(FLAGS.strategy, FLAGS.tpu), write_summaries=writable)
    _report(task, model_dir, results, step, prefix, writable)
    return 0


def _isdir(path: str) -> bool:
    """`os.path.isdir` that also answers for remote paths (gs://...)."""
    import tensorflow as tf  # noqa: PLC0415

    return tf.io.gfile.isdir(path)


def _report(task, model_dir: str, results: dict, step: int, prefix: str,
            writable: bool) -> None:
    """Prints the metrics, then writes them (and SQuAD's answers) into a writable model_dir.

    Raises:
      UserError: a write failed (a full disk, a refused write); the metrics are printed first.
    """
    from bert_trainer.runs import evaluation  # noqa: PLC0415

    print(f"bert-train evaluate: task {task.name}, checkpoint {prefix} (step {step})")
    width = max(map(len, results), default=0)
    for name, value in sorted(results.items()):
        print(f"  {name:<{width}}  {value:.4f}", flush=True)
    if not writable:
        files = [evaluation.own_file(evaluation.RESULTS_STEM, model_dir, prefix)]
        if getattr(task, "last_predictions", None):
            files.append(evaluation.own_file(evaluation.PREDICTIONS_STEM, model_dir, prefix))
        files = [*map(os.path.basename, files), "eval/ summaries"]
        print(f"bert-train evaluate: warning: {model_dir} is not writable; the metrics are "
              f"printed only ({', '.join(files)} not written)", file=sys.stderr, flush=True)
        return
    path = evaluation.write_results(task, model_dir, results, step, prefix)
    print(f"results written to {path}", flush=True)
