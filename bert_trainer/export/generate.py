"""`bert-train generate`: continue prompts with a causal LM, one JSON line per prompt.

The prompts come from flags, a file (one prompt a line; blank lines are prompts too: they
generate from the start of a document) or stdin. The model is a causal model directory
(wrapped in-process exactly as `export` wraps it) or a SavedModel written by `export`; both
run the serving module's `generate` signature (`serving.CausalLMServing`), in batches, with
the key/value cache.

Everything that can be known before generating is checked first, so a refusal writes
nothing: the settings, the output path, the model, and every prompt's length (its pieces,
`[SEP]` included, plus `max_new_tokens` must fit the model's positions). An output file is
written aside and renamed into place when complete. Output lines, in prompt order:
{"prompt": str, "generated": str, "score": float (log-probability of the generated pieces)}.

Sampling draws from a stateless RNG: the same seed, prompts and batch size give the same
text. Each batch folds its number into the seed, so batches do not share their noise.
"""

import contextlib
import dataclasses
import itertools
import json
import os
import secrets
import sys
import time
from collections.abc import Callable

import numpy as np
import tensorflow as tf

from bert_trainer import outputs
from bert_trainer.checkpoints import model_dir as model_dir_lib
from bert_trainer.errors import UserError
from bert_trainer.export import exporter, graph_check
from bert_trainer.export.predict import Progress
from bert_trainer.tasks.causal_lm import family as family_lib
from bert_trainer.tasks.causal_lm import serving

MAX_SEED = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class Settings:
    """How to generate. temperature 0 is greedy; top_k 0 and top_p 1 keep every token;
    max_new_tokens None: the model's default (an export: its bound); seed None: a random one."""

    max_new_tokens: int | None = None
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None

    def check(self) -> None:
        """Raises UserError, naming the flag, for settings that make no sampler."""
        if self.max_new_tokens is not None and self.max_new_tokens < 1:
            raise UserError(f"--max_new_tokens={self.max_new_tokens} must be >= 1")
        if not self.temperature >= 0:
            raise UserError(f"--temperature={self.temperature} must be >= 0 (0: greedy)")
        if self.top_k < 0:
            raise UserError(f"--top_k={self.top_k} must be >= 0 (0: every token)")
        if not 0 < self.top_p <= 1:
            raise UserError(f"--top_p={self.top_p} must be in (0, 1] (1: every token)")
        if self.seed is not None and not 0 <= self.seed <= MAX_SEED:
            raise UserError(f"--seed={self.seed} must be in [0, {MAX_SEED}]")


@dataclasses.dataclass
class Generator:
    """A model's generation functions (in-process or loaded from an export).

    Attributes:
      generate: (prompt, max_new_tokens, temperature, top_k, top_p, seed) -> serving outputs.
      prompt_length: (prompt) -> {prompt_length, max_prompt_length, max_new_tokens}.
      source: "--model_dir=DIR" or "--saved_model=DIR", for messages.
      max_new_tokens: the pieces asked per call (None: the functions' bound).
      holds: what the functions need alive (a loaded SavedModel), or None.
    """

    generate: Callable
    prompt_length: Callable
    source: str
    max_new_tokens: int | None = None
    holds: object = None

    def lengths(self, prompts: list[str]) -> tuple[np.ndarray, int, int]:
        """(pieces of each prompt, max prompt pieces, max_new_tokens)."""
        out = self.prompt_length(prompt=tf.constant(prompts or [""], tf.string))
        lengths = out[serving.PROMPT_LENGTH].numpy()[:len(prompts)]
        return (lengths, int(out[serving.MAX_PROMPT_LENGTH].numpy()),
                int(out[serving.MAX_NEW_TOKENS].numpy()))


def _from_model_dir(model_dir: str, checkpoint: str | None,
                    max_new_tokens: int | None) -> Generator:
    info = model_dir_lib.read_model_info(model_dir)
    task = info.task or {}
    if task.get("family") != family_lib.CausalLMFamily.name:
        trained = f"task '{task['name']}'" if task.get("name") else "masked LM pretraining"
        raise UserError(f"--model_dir={model_dir} is not a causal language model (it was "
                        f"trained for {trained}); generate from a model_dir pretrained with "
                        "--gin_file=configs/causal_lm/mini.gin")
    module = exporter.build_serving_module(model_dir, checkpoint=checkpoint)  # checks the model
    if max_new_tokens is not None:
        if max_new_tokens >= module.seq_length:
            raise UserError(f"--max_new_tokens={max_new_tokens} leaves no position for the "
                            f"prompt: the model has {module.seq_length} positions "
                            "(max_sequence_length); lower it")
        module.max_new_tokens = max_new_tokens  # before the first call traces the functions
    # In this process XLA is there: the compiled loop (an export leaves it off, see serving).
    module.jit_compile = True
    return Generator(module.function(serving.GENERATE), module.function(serving.PROMPT_LENGTHS),
                     f"--model_dir={model_dir}")


def _from_saved_model(saved_model: str, max_new_tokens: int | None,
                      trust: bool = False) -> Generator:
    import tensorflow_text  # noqa: F401, PLC0415 (registers the tokenizer ops of an export)

    if not os.path.isfile(os.path.join(saved_model, "saved_model.pb")):
        raise UserError(f"--saved_model={saved_model} holds no saved_model.pb; pass a directory "
                        "written by 'bert-train export'")
    graph_check.check_saved_model(saved_model, [serving.GENERATE, serving.PROMPT_LENGTHS],
                                  trust=trust)
    loaded = tf.saved_model.load(saved_model)
    missing = {serving.GENERATE, serving.PROMPT_LENGTHS} - set(loaded.signatures)
    if missing:
        raise UserError(f"--saved_model={saved_model} has no {sorted(missing)[0]} signature: "
                        "it is not the export of a causal language model")
    generator = Generator(loaded.signatures[serving.GENERATE],
                          loaded.signatures[serving.PROMPT_LENGTHS],
                          f"--saved_model={saved_model}", holds=loaded)
    bound = generator.lengths([])[2]
    if max_new_tokens is not None and max_new_tokens > bound:
        raise UserError(f"--max_new_tokens={max_new_tokens}: the export {saved_model} "
                        f"generates up to {bound} pieces (fixed when it was exported); pass "
                        f"at most {bound}, or generate from the --model_dir")
    generator.max_new_tokens = max_new_tokens
    return generator


def load_generator(*, model_dir: str | None = None, saved_model: str | None = None,
                   checkpoint: str | None = None,
                   max_new_tokens: int | None = None,
                   trust_saved_model: bool = False) -> Generator:
    """The generation functions of a causal model directory or of its export (exactly one).

    Args:
      model_dir: a model directory pretrained with the causal objective.
      saved_model: a directory written by `bert-train export` from one.
      checkpoint: model_dir only (see `checkpoints.select.select_checkpoint`).
      max_new_tokens: the most pieces generated (model_dir: any below its positions; an
        export: its own bound only); None: the default.
      trust_saved_model: load an export whose graph holds ops bert-train's exports never use
        (else refused before loading: `graph_check.check_saved_model`).

    Returns:
      A `Generator`.
    """
    if (model_dir is None) == (saved_model is None):
        raise UserError("pass exactly one of --model_dir (a causal LM run) and --saved_model "
                        "(its export)")
    if model_dir is not None:
        return _from_model_dir(model_dir, checkpoint, max_new_tokens)
    return _from_saved_model(saved_model, max_new_tokens, trust_saved_model)


def read_prompts(prompts: list[str] | None, input_path: str | None) -> list[str]:
    """The prompts of `--prompt` (repeatable) or of `--input` ('-' or neither: stdin).

    Raises:
      UserError: both given, a missing or non-UTF-8 input, no prompt at all.
    """
    if prompts and input_path is not None:
        raise UserError("pass --prompt or --input, not both")
    if prompts:
        return list(prompts)
    source = "<stdin>" if input_path in (None, "-") else input_path
    if input_path not in (None, "-") and not os.path.isfile(input_path):
        raise UserError(f"--input={input_path} does not exist; pass a file of prompts (one a "
                        "line) or - for stdin")
    if source == "<stdin>" and sys.stdin.isatty():
        print("generate: reading prompts from stdin, one a line (Ctrl-D ends)", file=sys.stderr)
    with contextlib.ExitStack() as stack:
        reader = (sys.stdin.buffer if source == "<stdin>"
                  else stack.enter_context(open(input_path, "rb")))
        lines = []
        for number, raw in enumerate(reader, 1):
            try:
                lines.append(raw.decode("utf-8").rstrip("\r\n"))
            except UnicodeDecodeError:
                raise UserError(f"{source}:{number}: not UTF-8 text; save the prompts as "
                                "UTF-8") from None
    if not lines:
        raise UserError(f"{source} holds no prompt; give one prompt a line, or --prompt")
    return lines


def check_prompt_lengths(generator: Generator, prompts: list[str], batch_size: int) -> int:
    """Refuses a prompt whose pieces and the new ones exceed the positions; returns the bound.

    Returns:
      max_new_tokens (the generator's, else its bound).
    """
    new = None
    for start in range(0, len(prompts), batch_size):
        lengths, max_prompt, bound = generator.lengths(prompts[start:start + batch_size])
        new = generator.max_new_tokens or bound
        positions = max_prompt + bound
        over = np.flatnonzero(lengths + new > positions)
        if over.size:
            i = start + int(over[0])
            length = int(lengths[over[0]])
            raise UserError(
                f"prompt {i + 1} ({prompts[i][:40]!r}) has {length} pieces ([SEP] included); "
                f"with max_new_tokens={new} that needs {length + new} positions, more than "
                f"the model's {positions}; shorten the prompt or lower --max_new_tokens")
    return new


def batch_seed(seed: int, batch_number: int) -> int:
    """The seed of one batch: `seed` with the batch's number folded in (int32 range)."""
    return (seed * 1_000_003 + batch_number) % (MAX_SEED + 1)


def generate_lines(generator: Generator, prompts: list[str], write: Callable[[str], None], *,
                   settings: Settings, batch_size: int = 8,
                   progress: Progress | None = None) -> int:
    """Generates for every prompt, in order and in batches; writes one JSON line each.

    Returns:
      The number of prompts answered.
    """
    done = 0
    for number, start in enumerate(range(0, len(prompts), batch_size)):
        batch = prompts[start:start + batch_size]
        out = generator.generate(
            prompt=tf.constant(batch, tf.string),
            max_new_tokens=tf.constant(generator.max_new_tokens or 0, tf.int32),
            temperature=tf.constant(settings.temperature, tf.float32),
            top_k=tf.constant(settings.top_k, tf.int32),
            top_p=tf.constant(settings.top_p, tf.float32),
            seed=tf.constant(batch_seed(settings.seed or 0, number), tf.int32))
        out = {k: v.numpy() for k, v in out.items()}
        answers = family_lib.CausalLMFamily()
        for i, prompt in enumerate(batch):
            write(json.dumps({"prompt": prompt, **answers.format_answer(out, i)},
                             ensure_ascii=False) + "\n")
        done += len(batch)
        if progress is not None:
            progress.update(done, done, final=done == len(prompts))
    return done


def is_generations_file(path: str) -> bool:
    """Whether `path` is empty or holds generate's JSON lines (checked on its first lines)."""
    try:
        with open(path, "rb") as f:
            head = [line for line in itertools.islice(f, 5) if line.strip()]
        records = [json.loads(line) for line in head]
    except (OSError, ValueError):
        return False
    return all(isinstance(r, dict) and {"prompt", "generated"} <= set(r) for r in records)


GENERATIONS = outputs.Kind("generate", "a generations file (JSON lines written by bert-train "
                           "generate)", directory=False, recognizes=is_generations_file)


def check_output(output_path: str, overwrite: bool = False) -> str:
    """`output_path` made absolute ("-" as is), once it is known that writing it loses nothing."""
    if output_path == "-":
        return output_path
    return outputs.check_output(output_path, GENERATIONS, overwrite=overwrite)


@dataclasses.dataclass
class GenerateSummary:
    prompts: int
    seconds: float
    seed: int


def run_generate(generator: Generator, prompts: list[str], output_path: str, *,
                 settings: Settings, batch_size: int = 8, overwrite: bool = False,
                 stderr=None) -> GenerateSummary:
    """`bert-train generate` once the generator and the prompts are known.

    Checks every prompt's length, then writes `output_path` ('-': stdout; a file is written
    aside and renamed into place when every prompt is answered).
    """
    stderr = stderr or sys.stderr
    if batch_size < 1:
        raise UserError(f"--batch_size={batch_size} must be >= 1")
    output_path = check_output(output_path, overwrite)
    check_prompt_lengths(generator, prompts, batch_size)
    if settings.seed is None:  # a fresh seed, reported so that the run can be repeated
        settings = dataclasses.replace(settings, seed=secrets.randbelow(MAX_SEED + 1))
    start = time.perf_counter()
    progress = Progress(stderr, len(prompts), command="generate", done="generated")
    with contextlib.ExitStack() as stack:
        if output_path == "-":
            stack.callback(sys.stdout.flush)
            write = sys.stdout.write
        else:
            write = stack.enter_context(outputs.new_file(output_path,
                                                         writing="generations")).write
        count = generate_lines(generator, prompts, write, settings=settings,
                               batch_size=batch_size, progress=progress)
    return GenerateSummary(count, time.perf_counter() - start, settings.seed)
