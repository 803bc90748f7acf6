"""Targets and the markdown block of the causal-LM benchmark (results_causal_lm.json -> README)."""

BEGIN, END = "<!-- benchmark-causal-lm:begin -->", "<!-- benchmark-causal-lm:end -->"
LABELS = {"bert_train": "bert-train CausalLM", "keras_hub": "keras-hub GPT2Backbone, tied",
          "cached": "bert-train generate, cache (XLA, the default)",
          "uncached": "bert-train generate, no cache",
          "cached_graph": "bert-train generate, cache, no XLA (as an export runs)",
          "keras_hub_generate": "keras-hub GPT2CausalLM.generate",
          "lstm": "LSTM language model (course)"}
STEP_GOAL = 1.5  # bert-train's steps/s over keras-hub's.
GENERATE_GOAL = 1.5  # bert-train's cached tokens/s over keras-hub's.
CACHE_GOAL = 5.0  # bert-train's cached tokens/s over its uncached.
QUALITY_GOAL = 1.0  # The LSTM's held-out perplexity over bert-train's: lower is the goal.


def _ok(rows: list[dict], kind: str) -> dict | None:
    return next((r for r in rows if r["implementation"] == kind and r["status"] == "ok"), None)


def _ratio(a: dict | None, b: dict | None, key: str) -> float | None:
    return a[key] / b[key] if a and b else None


def _target(name: str, value, goal: float, detail: str) -> dict:
    return {"name": name, "value": value, "goal": goal,
            "met": None if value is None else value >= goal, "detail": detail}


def targets(results: dict) -> list[dict]:
    """The issue's targets that this run measured (value None where a side is missing)."""
    rows = []
    if "step" in results:
        step = results["step"]
        rows.append(_target("train step: bert-train / keras-hub steps/s",
                            _ratio(_ok(step, "bert_train"), _ok(step, "keras_hub"),
                                   "steps_per_s"),
                            STEP_GOAL, "same size, batch and blocks, alternating rounds"))
    if "generate" in results:
        gen = results["generate"]
        cached = _ok(gen, "cached")
        rows.append(_target("generation: bert-train (cache) / keras-hub tokens/s",
                            _ratio(cached, _ok(gen, "keras_hub_generate"), "tokens_per_s"),
                            GENERATE_GOAL, "greedy, same prompts and new tokens"))
        rows.append(_target("generation: bert-train with / without the cache, tokens/s",
                            _ratio(cached, _ok(gen, "uncached"), "tokens_per_s"),
                            CACHE_GOAL, "greedy, same model and prompts"))
    if "quality" in results:
        q = results["quality"]
        rows.append(_target("held-out perplexity: LSTM / bert-train (lower is better)",
                            _ratio(_ok(q, "lstm"), _ok(q, "bert_train"), "perplexity"),
                            QUALITY_GOAL, "equal wall-clock, same blocks, alternating turns"))
    return rows


def _fmt(value, digits: int = 2) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}" if isinstance(value, float) else f"{value:,}"


def _row(cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _load(section: dict) -> str:
    start, end = section.get("load_average_start"), section.get("load_average_end")
    return f"{start[0]:.1f} -> {end[0]:.1f}" if start and end else "-"


def _not_measured(row: dict) -> str:
    return f"{row['status']}: {row.get('note', '')[:160]}"


def _step_lines(results: dict, s: dict) -> list[str]:
    peak = results.get("peak", {}).get("gflops")
    out = [f"### Train step: {s['size']} (L/H/A/F), vocabulary {s['vocab_size']:,}, batch "
           f"{s['batch_size']} x sequence {s['seq_length']}, float32, AdamW, clip 1.0", "",
           f"Load average (1 min) over the section: {_load(results['loads']['step'])}; "
           f"fp32 matmul peak {_fmt(peak, 1)} GFLOP/s (same rounds).", "",
           _row(["implementation", "step (s)", "steps/s", "tokens/s", "GFLOP/s", "MFU",
                 "params", "peak RSS (MB)", "loop"]), _row(["---"] * 9)]
    for r in results["step"]:
        if r["status"] != "ok":
            out.append(_row([LABELS[r["implementation"]], _not_measured(r)] + [""] * 7))
            continue
        mfu = f"{100 * r['mfu']:.1f} %" if r.get("mfu") is not None else "-"
        out.append(_row([LABELS[r["implementation"]], _fmt(r["step_time_s"], 3),
                         _fmt(r["steps_per_s"], 3), _fmt(r["tokens_per_s"], 0),
                         _fmt(r["gflops"], 1), mfu, _fmt(r["params"]),
                         _fmt(r["peak_rss_mb"], 0), r.get("loop", "")]))
    return out + [""]


def _generate_lines(results: dict, s: dict) -> list[str]:
    out = [f"### Generation: greedy, batch {s['gen_batch_size']}, prompts of "
           f"{s['prompt_length']} tokens, {s['max_new_tokens']} new tokens, random weights", "",
           f"Load average (1 min) over the section: {_load(results['loads']['generate'])}.", "",
           _row(["implementation", "call (s)", "new tokens/s", "params"]), _row(["---"] * 4)]
    for r in results["generate"]:
        if r["status"] != "ok":
            out.append(_row([LABELS[r["implementation"]], _not_measured(r), "", ""]))
            continue
        out.append(_row([LABELS[r["implementation"]], _fmt(r["call_time_s"], 3),
                         _fmt(r["tokens_per_s"], 1), _fmt(r["params"])]))
    return out + [""]


def _quality_lines(results: dict, s: dict) -> list[str]:
    d = results.get("data", {})
    out = [f"### Quality: {s['budget_minutes']:g} minutes of training each (turns of "
           f"{s['turn_seconds']:g} s), blocks of {s['block_size']}, batch "
           f"{s['quality_batch_size']}", "",
           f"Load average (1 min) over the section: {_load(results['loads']['quality'])}. "
           f"Vocabulary {_fmt(d.get('vocab_size'))} uncased WordPiece pieces; "
           f"{_fmt(d.get('blocks', {}).get('train'))} training blocks from "
           f"{_fmt(d.get('documents', {}).get('train'))} documents, "
           f"{_fmt(d.get('blocks', {}).get('heldout'))} held-out blocks from "
           f"{_fmt(d.get('documents', {}).get('heldout'))} documents (one in "
           f"{s['holdout_every']}).", "",
           _row(["model", "params", "steps", "train (s)", "tokens trained",
                 "held-out perplexity", "next-token accuracy", "held-out blocks scored"]),
           _row(["---"] * 8)]
    for r in results["quality"]:
        if r["status"] != "ok":
            out.append(_row([LABELS[r["implementation"]], _not_measured(r)] + [""] * 6))
            continue
        out.append(_row([LABELS[r["implementation"]], _fmt(r["params"]), _fmt(r["steps"]),
                         _fmt(r["train_seconds"], 0), _fmt(r["tokens_trained"]),
                         _fmt(r["perplexity"], 1), _fmt(r["next_token_accuracy"], 3),
                         _fmt(r["heldout_blocks"])]))
    return out + [""]


def markdown(results: dict) -> str:
    """The README block: machine, settings, one table per section, the targets."""
    m, s = results["machine"], results["settings"]
    lines = [f"Measured {m['date']} on **{m['cpu_model']}**, {m['usable_cores']} usable cores; "
             f"load average {m['load_average_start'][0]:.2f} at start, "
             f"{m['load_average_end'][0]:.2f} at end; total {results['total_seconds']:.0f} s."
             + (" **Smoke run: the numbers mean nothing.**" if s["smoke"] else ""), ""]
    sections = {"step": _step_lines, "generate": _generate_lines, "quality": _quality_lines}
    for name, render in sections.items():
        if name in results:
            lines += render(results, s)
    if results.get("targets"):
        lines += ["### Targets", "", _row(["target", "measured", "goal", "met", "from"]),
                  _row(["---"] * 5)]
        for t in results["targets"]:
            met = "-" if t["met"] is None else ("yes" if t["met"] else "no")
            lines.append(_row([t["name"], "-" if t["value"] is None else f"{t['value']:.2f}x",
                               f">= {t['goal']}x", met, t["detail"]]))
        lines.append("")
    return "\n".join(lines) + "\n"
