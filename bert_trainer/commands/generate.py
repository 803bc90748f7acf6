"""`bert-train generate`: continue prompts with a causal language model, one JSON line each.

  bert-train generate --model_dir=runs/gpt --prompt="the old house" --max_new_tokens=40
  bert-train generate --saved_model=exports/gpt --input=prompts.txt --output=out.jsonl \\
      --temperature=0.8 --top_p=0.9 --seed=1

Prompts come from --prompt (repeatable), --input (one prompt a line) or stdin. Greedy at
--temperature=0 (the default), else sampled with --top_k/--top_p; the same --seed, prompts and
--batch_size give the same text. Generation stops at the end token ([SEP]) or after
--max_new_tokens pieces. Output lines: {"prompt", "generated", "score"}. From a --model_dir
the decoding loop runs compiled with XLA (a first batch per prompt-width bucket compiles); an
export runs it in the graph executor, which any TensorFlow runtime has: the same seed gives
the same text from both. See bert_trainer/export/generate.py.
"""

import sys

from absl import flags

from bert_trainer.commands import shared_flags
from bert_trainer.commands.shared_flags import Flag, Usage
from bert_trainer.export import generate as run

SHARED_FLAGS = shared_flags.declare(
    __name__,
    model_dir=Usage(None, "Model directory pretrained with the causal_lm objective."),
    saved_model=Usage(None, "Or: a directory written by 'bert-train export' from one."),
    trust_saved_model=Usage(False, "Load the --saved_model even if its graph holds ops "
                            "bert-train's exports never use (files, Python, network): "
                            "only one whose source you trust."),
    input=Usage(None, "File of prompts, one a line, or - for stdin (the default when no "
                "--prompt is given)."),
    output=Usage("-", "Output JSON lines file, or - for stdout."),
    overwrite=Usage(False, "Replace an existing --output file that holds generations "
                    "(nothing else), once every prompt is answered."),
    batch_size=Usage(8, "Prompts per model call."),
    checkpoint=Usage(None, "With --model_dir: best, latest, a step or a prefix in it."),
    seed=Usage(None, "Sampling seed (default: a random one, printed); the same seed, "
               "prompts and --batch_size give the same text."),
    prompt=Flag("multi_string", None, "A prompt (repeat the flag for several)."),
    max_new_tokens=Flag(
        "integer", None,
        "The most word pieces generated per prompt; default: 64 (at most half the positions), "
        "or an export's bound."),
    temperature=Flag("float", 0.0, "0: greedy; else sample from softmax(logits / temperature)."),
    top_k=Flag("integer", 0, "Sample among the k most likely pieces only (0: all)."),
    top_p=Flag(
        "float", 1.0,
        "Sample from the smallest set of pieces whose probability reaches top_p (1: all)."))
FLAGS = flags.FLAGS


def main(argv):
    del argv
    settings = run.Settings(max_new_tokens=FLAGS.max_new_tokens, temperature=FLAGS.temperature,
                            top_k=FLAGS.top_k, top_p=FLAGS.top_p, seed=FLAGS.seed)
    settings.check()
    run.check_output(FLAGS.output, FLAGS.overwrite)  # before the slow part
    prompts = run.read_prompts(FLAGS.prompt, FLAGS.input)
    generator = run.load_generator(model_dir=FLAGS.model_dir, saved_model=FLAGS.saved_model,
                                   checkpoint=FLAGS.checkpoint,
                                   max_new_tokens=FLAGS.max_new_tokens,
                                   trust_saved_model=FLAGS.trust_saved_model)
    summary = run.run_generate(generator, prompts, FLAGS.output, settings=settings,
                               batch_size=FLAGS.batch_size, overwrite=FLAGS.overwrite)
    seed = f" (seed {summary.seed})" if settings.temperature > 0 else ""
    plural = "" if summary.prompts == 1 else "s"
    print(f"generate: {summary.prompts} prompt{plural} in {summary.seconds:.1f}s{seed}",
          file=sys.stderr)
    return 0
