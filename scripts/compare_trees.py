#!/usr/bin/env python3
"""Paired A/B of bert-train's pretraining step in two checkouts: what a change buys, as a ratio.

Each checkout's step (its own `bert_trainer` and `scripts/bench`, built by the benchmark's
`bert_train` worker) runs in its own warm process; the rounds alternate A, B, A, B, ... so
both see the same machine conditions, and the ratio of each round's pair is reported with
their median. The baseline is any other checkout, e.g.

    git worktree add /tmp/base 51b7782
    .venv/bin/python scripts/compare_trees.py --baseline=/tmp/base --rounds=11
"""

import argparse
import json
import pathlib
import statistics
import sys
import tempfile

SCRIPTS = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(SCRIPTS))

from bench import measure  # noqa: E402
from bench import spec as spec_lib  # noqa: E402
from bench.worker import Worker  # noqa: E402


def compare(baseline: str, candidate: str, step: spec_lib.StepSpec, *, rounds: int,
            steps: int, warmup: int, log_path: str) -> dict:
    """Times `step` in both checkouts, alternating; returns medians and paired ratios.

    Returns:
      {"baseline_s", "candidate_s": median step seconds, "ratio": median over rounds of
      baseline / candidate time (> 1: the candidate is faster), "round_ratios": [...]} or
      {"error": ...} when a worker failed.
    """
    workers = [Worker("bert_train", {"step": step.to_json()}, log_path, checkout=tree)
               for tree in (baseline, candidate)]
    try:
        outcomes = measure.alternate(workers, warmup=warmup, rounds=rounds, steps=steps)
    finally:
        for worker in workers:
            worker.close()
    errors = [o["error"] for o in outcomes if "error" in o]
    if errors:
        return {"error": "; ".join(errors)}
    times = [[r["seconds"] / steps for r in o["runs"]] for o in outcomes]
    ratios = [a / b for a, b in zip(*times, strict=True)]
    return {"baseline_s": statistics.median(times[0]), "candidate_s": statistics.median(times[1]),
            "ratio": statistics.median(ratios), "round_ratios": ratios}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="the other checkout (A)")
    parser.add_argument("--candidate", default=str(SCRIPTS.parent),
                        help="the checkout measured against it (B; default: this one)")
    parser.add_argument("--size", default="mini", choices=sorted(spec_lib.SIZES))
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--seq_length", type=int, default=128)
    parser.add_argument("--max_predictions", type=int, default=20)
    parser.add_argument("--mixed_precision", default=None, choices=[None, "bfloat16"])
    parser.add_argument("--jit_compile", action="store_true")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--steps", type=int, default=2, help="steps per worker per round")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--output", default=None, help="also write the result as JSON here")
    args = parser.parse_args(argv)
    for tree in (args.baseline, args.candidate):
        if not (pathlib.Path(tree) / "scripts" / "bench" / "worker.py").is_file():
            print(f"error: {tree} is not a bert-train checkout with scripts/bench; pass a "
                  "directory made by e.g. 'git worktree add DIR COMMIT'", file=sys.stderr)
            return 2
    step = spec_lib.StepSpec(spec_lib.SIZES[args.size], args.batch_size, args.seq_length,
                             args.max_predictions, args.jit_compile, args.mixed_precision)
    log_path = str(pathlib.Path(tempfile.gettempdir()) / "bert_train_compare_trees.log")
    result = compare(args.baseline, args.candidate, step, rounds=args.rounds, steps=args.steps,
                     warmup=args.warmup, log_path=log_path)
    result.update(baseline=args.baseline, candidate=args.candidate, step=step.to_json(),
                  rounds=args.rounds, steps=args.steps)
    if args.output:
        pathlib.Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    if "error" in result:
        print(f"error: {result['error']} (worker logs: {log_path})", file=sys.stderr)
        return 1
    print(f"baseline  {result['baseline_s']:.4f} s/step  ({args.baseline})")
    print(f"candidate {result['candidate_s']:.4f} s/step  ({args.candidate})")
    print(f"speed-up {result['ratio']:.3f}x (median of {args.rounds} paired rounds: "
          + " ".join(f"{r:.3f}" for r in result["round_ratios"]) + ")")
    return 0


if __name__ == "__main__":
    sys.exit(main())
