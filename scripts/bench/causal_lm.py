#!/usr/bin/env python3
"""The causal-LM benchmark: bert-train's CausalLM against keras-hub's GPT-2 and an LSTM LM.

Sections (--only picks some):

  step      training step of bert-train's CausalLM (its trainer and causal-LM task where they
            are in the tree) vs keras-hub's GPT2Backbone + tied output, same size (mini:
            4/256/4/1024), batch, sequence (256) and optimizer (AdamW), alternating rounds
            with a matmul worker for the MFU reference (bench/measure.py); target >= 1.5x.
  generate  greedy generation tokens/s: bert-train's generate() with the key/value cache vs
            keras-hub's GPT2CausalLM.generate (target >= 1.5x) and vs generate(use_cache=False)
            (target >= 5x); same size, prompts and new tokens, random weights, alternating.
  quality   a mini CausalLM and the course's LSTM language model train for the same wall-clock
            (--budget_minutes each, alternating turns) on the same packed blocks of
            ../shared/data/corpus; held-out perplexity of each (same WordPiece vocabulary, so
            comparable); lower is the goal.

  scripts/bench/causal_lm.py --output benchmarks/results_causal_lm.json --table benchmarks/README.md
  scripts/bench/causal_lm.py --smoke --output /tmp/c.json    # tiny sizes, seconds: the harness only

Every model lives in its own worker process (bench/worker.py). Method and results:
benchmarks/README.md, section "Causal language modelling".
"""

import argparse
import math
import os
import pathlib
import statistics
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench import causal_lm_report, measure, progress, report  # noqa: E402
from bench.progress import say  # noqa: E402
from bench.worker import Worker, preload_workers  # noqa: E402

SECTIONS = ("step", "generate", "quality")
REPO = pathlib.Path(__file__).resolve().parents[2]
WORKER_TIMEOUT_S = 1800.0


def _failed(outcome: dict) -> dict | None:
    if "error" in outcome:
        error = outcome["error"]
        return {"status": "skipped" if error.startswith(measure.SKIP_PREFIXES) else "failed",
                "note": error}
    return None


def _close(workers) -> None:
    for worker in workers:
        worker.close()


def step_section(args, results: dict) -> list[dict]:
    """bert-train vs keras-hub training steps, same size, batch and blocks, alternating; MFU."""
    kinds = ("bert_train", "keras_hub")
    say(f"causal step: {' vs '.join(kinds)}, {args.size}, {args.batch_size} x {args.seq_length}")
    params = {"vocab_size": args.vocab_size, "size": args.size, "seq_length": args.seq_length,
              "batch_size": args.batch_size, "seed": args.seed}
    workers = [Worker("causal_lm_step", {"kind": k, **params}, args.log, WORKER_TIMEOUT_S)
               for k in kinds]
    workers.append(Worker("matmul", {"n": args.matmul_n}, args.log, WORKER_TIMEOUT_S))
    try:
        outcomes = measure.alternate(workers, warmup=args.step_warmup, rounds=args.step_rounds,
                                     steps=[args.step_steps] * len(kinds) + [args.matmuls])
    finally:
        _close(workers)
    peak = outcomes[-1]
    if "error" not in peak and peak["runs"]:
        results["peak"] = {"n": args.matmul_n, "gflops": statistics.median(
            r["flops"] / r["seconds"] / 1e9 for r in peak["runs"])}
    gflops_peak = results.get("peak", {}).get("gflops")
    rows = []
    for kind, outcome in zip(kinds, outcomes, strict=False):
        row = {"implementation": kind, **(_failed(outcome) or {})}
        if "status" not in row and outcome["runs"]:
            seconds = measure.median_unit_seconds(outcome["runs"], units=args.step_steps)
            info = outcome["build"]["info"]
            row.update(status="ok", step_time_s=seconds, steps_per_s=1.0 / seconds,
                       step_times_s=[r["seconds"] / args.step_steps for r in outcome["runs"]],
                       tokens_per_s=args.batch_size * args.seq_length / seconds,
                       gflops=info["flops_per_step"] / seconds / 1e9,
                       final_loss=outcome["runs"][-1]["loss"],
                       peak_rss_mb=max(r["peak_rss_mb"] for r in outcome["runs"]), **info)
            row["mfu"] = row["gflops"] / gflops_peak if gflops_peak else None
        say(f"  {kind}: {row.get('status', 'failed')} {row.get('step_time_s', 0):.3f} s/step "
            f"{row.get('note', '')[:200]}")
        rows.append(row)
    return rows


def generate_section(args, results: dict) -> list[dict]:
    """Greedy generation tokens/s of the three kinds, alternating rounds of one call each."""
    kinds = ("cached", "uncached", *(("cached_graph",) if args.gen_graph else ()), "keras_hub")
    say(f"causal generate: {', '.join(kinds)}; batch {args.gen_batch_size}, prompt "
        f"{args.prompt_length}, {args.max_new_tokens} new tokens")
    params = {"vocab_size": args.vocab_size, "size": args.size,
              "batch_size": args.gen_batch_size, "prompt_length": args.prompt_length,
              "max_new_tokens": args.max_new_tokens, "seed": args.seed}
    workers = [Worker("causal_lm_generate", {"kind": k, **params}, args.log, WORKER_TIMEOUT_S)
               for k in kinds]
    try:
        outcomes = measure.alternate(workers, warmup=0, rounds=args.gen_rounds, steps=1)
    finally:
        _close(workers)
    rows = []
    for kind, outcome in zip(kinds, outcomes, strict=True):
        name = "keras_hub_generate" if kind == "keras_hub" else kind
        row = {"implementation": name, **(_failed(outcome) or {})}
        if "status" not in row and outcome["runs"]:
            seconds = measure.median_unit_seconds(outcome["runs"], units=1)
            info = outcome["build"]["info"]
            row.update(status="ok", call_time_s=seconds,
                       call_times_s=[r["seconds"] for r in outcome["runs"]],
                       tokens_per_s=info["tokens_per_call"] / seconds, params=info["params"],
                       first_call_s=outcome["build"]["build_s"])
        say(f"  {name}: {row.get('status', 'failed')} {row.get('tokens_per_s', 0):.1f} tokens/s "
            f"{row.get('note', '')[:200]}")
        rows.append(row)
    return rows


def quality_section(args, results: dict) -> list[dict]:
    """CausalLM and the LSTM LM trained for the same wall-clock in turns; held-out perplexity."""
    from bench import causal_lm_data  # noqa: PLC0415

    kinds = ("bert_train", "lstm")
    with tempfile.TemporaryDirectory(prefix="bert_train_causal_lm_") as workdir:
        say("causal quality: reading, tokenizing and packing the corpus"
            + ("" if args.vocab_file else " (learning the vocabulary first)"))
        data = causal_lm_data.prepare(
            str(pathlib.Path(args.shared_dir) / "data" / "corpus"), workdir,
            block_size=args.block_size, vocab_size=args.quality_vocab_size,
            holdout_every=args.holdout_every, vocab_file=args.vocab_file,
            max_documents=args.max_documents, vocab_sample_chars=args.vocab_sample_chars)
        if args.keep_vocab and not args.vocab_file:
            pathlib.Path(args.keep_vocab).write_bytes(pathlib.Path(data["vocab_file"]).read_bytes())
        results["data"] = {k: v for k, v in data.items() if not k.endswith("_file")}
        say(f"  {data['blocks']['train']:,} training blocks, {data['blocks']['heldout']:,} "
            f"held out, vocabulary {data['vocab_size']:,}")
        budget_s = args.budget_minutes * 60.0
        rounds = max(1, math.ceil(budget_s / args.turn_seconds))
        turn = max(1, round(budget_s / rounds))  # Whole seconds: the protocol's unit count.
        params = {"train_file": data["train_file"], "heldout_file": data["heldout_file"],
                  "vocab_size": data["vocab_size"], "size": args.size, "dropout": args.dropout,
                  "batch_size": args.quality_batch_size, "learning_rate": args.learning_rate,
                  "warmup_steps": args.warmup_steps, "lstm_units": args.lstm_units,
                  "lstm_layers": args.lstm_layers, "max_eval_blocks": args.max_eval_blocks,
                  "seed": args.seed}
        say(f"causal quality: {', '.join(kinds)}: {rounds} turns of {turn} s each")
        workers = [Worker("causal_lm_budget", {"kind": k, **params}, args.log,
                          WORKER_TIMEOUT_S) for k in kinds]
        try:
            outcomes = measure.alternate(workers, warmup=0, rounds=rounds, steps=turn)
            rows = [_score(kind, worker, outcome, args)
                    for kind, worker, outcome in zip(kinds, workers, outcomes, strict=True)]
        finally:
            _close(workers)
    return rows


def _score(kind: str, worker: Worker, outcome: dict, args) -> dict:
    from bench.worker import WorkerError  # noqa: PLC0415

    row = {"implementation": kind, **(_failed(outcome) or {})}
    if "status" not in row:
        try:
            scored = worker.run(0)
        except WorkerError as e:
            row.update(status="failed", note=str(e))
        else:
            info = outcome["build"]["info"]
            row.update(status="ok", params=info["params"], steps=scored["steps"],
                       train_seconds=scored["train_seconds"],
                       tokens_trained=scored["steps"] * args.quality_batch_size
                       * info["block_size"], heldout_blocks=info["heldout_blocks"],
                       final_train_loss=outcome["runs"][-1]["loss"],
                       **{k: scored[k] for k in ("perplexity", "loss", "next_token_accuracy",
                                                 "scored_tokens", "eval_seconds")})
    say(f"  {kind}: {row['status']} perplexity {row.get('perplexity', float('nan')):.1f} "
        f"after {row.get('steps', 0)} steps {row.get('note', '')[:200]}")
    return row


def run(args) -> dict:
    """All requested sections; returns the results dict (results_causal_lm.json)."""
    results = {"schema_version": 1, "machine": report.machine_info(),
               "settings": {k: v for k, v in vars(args).items() if k not in ("output", "table")},
               "loads": {}}
    sections = {"step": step_section, "generate": generate_section, "quality": quality_section}
    for name in args.only:
        load = {"load_average_start": os.getloadavg()}
        results[name] = sections[name](args, results)
        results["loads"][name] = {**load, "load_average_end": os.getloadavg()}
    results["targets"] = causal_lm_report.targets(results)
    results["machine"]["load_average_end"] = os.getloadavg()
    results["total_seconds"] = progress.elapsed()
    return results


SMOKE = {"size": "1/32/2/64", "vocab_size": 500, "seq_length": 32, "batch_size": 2,
         "step_warmup": 1, "step_rounds": 2, "step_steps": 1, "matmul_n": 256, "matmuls": 2,
         "gen_batch_size": 2, "prompt_length": 4, "max_new_tokens": 4, "gen_rounds": 2,
         "gen_graph": False,
         "max_documents": 12, "holdout_every": 4, "quality_vocab_size": 400, "block_size": 32,
         "quality_batch_size": 4, "budget_minutes": 0.025, "turn_seconds": 1.0,
         "warmup_steps": 2, "lstm_units": 32, "lstm_layers": 1, "max_eval_blocks": 64}
POSITIVE = ("vocab_size", "seq_length", "batch_size", "step_rounds", "step_steps", "matmul_n",
            "matmuls", "gen_batch_size", "prompt_length", "max_new_tokens", "gen_rounds",
            "holdout_every", "quality_vocab_size", "block_size", "quality_batch_size",
            "budget_minutes", "turn_seconds", "learning_rate", "lstm_units", "lstm_layers")


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--output", default="benchmarks/results_causal_lm.json", help="results JSON")
    p.add_argument("--table", default=None, help="markdown file whose causal-LM block is "
                   "(re)written, e.g. benchmarks/README.md")
    p.add_argument("--smoke", action="store_true",
                   help="tiny sizes and seconds of training: checks the harness, not the models")
    p.add_argument("--only", default=",".join(SECTIONS), help=f"comma list of {SECTIONS}")
    p.add_argument("--size", default="4/256/4/1024", help="Transformer size L/H/A/F (mini)")
    p.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("step and generate sections")
    g.add_argument("--vocab_size", type=int, default=30522,
                   help="vocabulary of the step and generation models (BERT's WordPiece size)")
    g.add_argument("--seq_length", type=int, default=256)
    g.add_argument("--batch_size", type=int, default=16)
    g.add_argument("--step_warmup", type=int, default=2, help="untimed steps per model")
    g.add_argument("--step_rounds", type=int, default=5, help="alternating rounds")
    g.add_argument("--step_steps", type=int, default=2, help="steps per model per round")
    g.add_argument("--matmul_n", type=int, default=2048, help="side of the peak's matmuls")
    g.add_argument("--matmuls", type=int, default=3, help="peak matmuls per round")
    g.add_argument("--gen_batch_size", type=int, default=4)
    g.add_argument("--prompt_length", type=int, default=32)
    g.add_argument("--max_new_tokens", type=int, default=64)
    g.add_argument("--gen_rounds", type=int, default=3, help="alternating rounds of one call")
    g.add_argument("--gen_graph", action=argparse.BooleanOptionalAction, default=True,
                   help="also time generate(jit_compile=False), the cached loop in the graph "
                        "executor as an export runs it (an extra row; off in --smoke)")
    g = p.add_argument_group("quality section")
    g.add_argument("--budget_minutes", type=float, default=10.0,
                   help="wall-clock training time of each model")
    g.add_argument("--turn_seconds", type=float, default=60.0,
                   help="length of one model's turn while the two alternate")
    g.add_argument("--block_size", type=int, default=128, help="tokens per packed block")
    g.add_argument("--quality_batch_size", type=int, default=16)
    g.add_argument("--quality_vocab_size", type=int, default=8000,
                   help="size of the WordPiece vocabulary learned from the training documents")
    g.add_argument("--vocab_sample_chars", type=int, default=2_000_000,
                   help="learn the vocabulary from evenly spaced training documents of at "
                        "most this many characters (0: all; the whole corpus takes many "
                        "minutes on 2 cores)")
    g.add_argument("--vocab_file", default=None, help="an uncased vocabulary to use instead "
                   "of learning one (e.g. what --keep_vocab saved)")
    g.add_argument("--keep_vocab", default=None, help="also save the learned vocabulary here")
    g.add_argument("--holdout_every", type=int, default=20,
                   help="hold out every N-th document of the corpus")
    g.add_argument("--max_documents", type=int, default=0, help="first N documents (0: all)")
    g.add_argument("--max_eval_blocks", type=int, default=0,
                   help="score at most this many held-out blocks, evenly spaced (0: all)")
    g.add_argument("--dropout", type=float, default=0.1)
    g.add_argument("--learning_rate", type=float, default=1e-3, help="peak, both models")
    g.add_argument("--warmup_steps", type=int, default=100)
    g.add_argument("--lstm_units", type=int, default=512)
    g.add_argument("--lstm_layers", type=int, default=2)
    p.add_argument("--shared_dir", default=str(REPO.parent / "shared"))
    p.add_argument("--log", default=os.path.join(tempfile.gettempdir(),
                                                 "bert_train_causal_lm.log"), help="worker logs")
    args = p.parse_args(argv)
    if args.smoke:  # Smoke sizes unless a flag set them explicitly.
        given = {a.split("=")[0].lstrip("-") for a in argv if a.startswith("--")}
        for key, value in SMOKE.items():
            if key not in given:
                setattr(args, key, value)
    args.only = tuple(filter(None, args.only.split(",")))
    unknown = sorted(set(args.only) - set(SECTIONS))
    if unknown:
        p.error(f"--only: unknown sections {unknown}; choose from {','.join(SECTIONS)}")
    for name in POSITIVE:
        if getattr(args, name) <= 0:
            p.error(f"--{name} must be > 0")
    parts = args.size.split("/")  # Checked here without importing TensorFlow (the models do).
    if len(parts) != 4 or not all(x.isdigit() and int(x) > 0 for x in parts):
        p.error(f"--size={args.size}: give L/H/A/F, e.g. 4/256/4/1024")
    if "quality" in args.only and not (pathlib.Path(args.shared_dir) / "data" / "corpus").is_dir():
        p.error(f"--shared_dir={args.shared_dir} has no data/corpus")
    if args.vocab_file and not os.path.isfile(args.vocab_file):
        p.error(f"--vocab_file={args.vocab_file} is not a file")
    return args


def _run(args) -> dict:
    if args.smoke:  # The harness only: workers share one TensorFlow import.
        preload_workers()
    os.makedirs(os.path.dirname(os.path.abspath(args.log)), exist_ok=True)
    return run(args)


def publish(args, results: dict) -> int:
    """The README table, the summary, and the exit code (1 when a row failed)."""
    table = causal_lm_report.markdown(results)
    if args.table:
        report.update_readme(args.table, table, causal_lm_report.BEGIN, causal_lm_report.END)
    print(table)
    say(f"wrote {args.output}{' and ' + args.table if args.table else ''}; "
        f"worker logs: {args.log}")
    rows = [r for s in SECTIONS for r in results.get(s, [])]
    return 1 if any(r["status"] == "failed" for r in rows) else 0


def main(argv=None) -> int:
    return report.harness_main(argv, name="causal_lm", parse_args=parse_args, run=_run,
                               publish=publish)


if __name__ == "__main__":
    sys.exit(main())
