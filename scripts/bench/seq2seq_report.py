"""Targets and the markdown block of the seq2seq benchmark (results_seq2seq.json -> README)."""

BEGIN, END = "<!-- benchmark-seq2seq:begin -->", "<!-- benchmark-seq2seq:end -->"
LABELS = {"bert_train": "bert-train Seq2SeqTransformer",
          "keras_hub": "keras-hub TransformerEncoder/Decoder (keras.io structure)",
          "gru": "GRU encoder-decoder (course)", "bahdanau": "GRU + Bahdanau attention (course)",
          "bert2bert": "BERT2BERT warm started from MiniLM",
          "bert2bert_scratch": "same size, from scratch"}
STEP_GOAL = 1.5  # bert-train's step speed over keras-hub's.
BLEU_GOAL = 10.0  # bert-train's dev BLEU over the better GRU model's.


def _ok(rows: list[dict], kind: str) -> dict | None:
    return next((r for r in rows if r["implementation"] == kind and r["status"] == "ok"), None)


def best_bleu(row: dict | None) -> float | None:
    """The highest dev BLEU of a row over its decoding settings (None: not measured)."""
    if not row or not row.get("decoded"):
        return None
    return max(d["bleu"] for d in row["decoded"].values())


def _target(name: str, value, goal: float, unit: str, detail: str) -> dict:
    return {"name": name, "value": value, "goal": goal, "unit": unit,
            "met": None if value is None else value >= goal, "detail": detail}


def targets(results: dict) -> list[dict]:
    """The issue's targets that this run measured (value None where a side is missing)."""
    rows = []
    if "step" in results:
        bert, hub = _ok(results["step"], "bert_train"), _ok(results["step"], "keras_hub")
        value = hub["step_time_s"] / bert["step_time_s"] if bert and hub else None
        rows.append(_target("training step: keras-hub time / bert-train time", value,
                            STEP_GOAL, "x", "same size, batch and batches, alternating"))
    if "budget" in results:
        bert = best_bleu(_ok(results["budget"], "bert_train"))
        rnn = [best_bleu(_ok(results["budget"], k)) for k in ("gru", "bahdanau")]
        value = bert - max(rnn) if bert is not None and None not in rnn else None
        rows.append(_target("dev BLEU: bert-train minus the better GRU model", value,
                            BLEU_GOAL, " BLEU", "equal wall-clock, alternating turns"))
    return rows


def _fmt(value, digits: int = 2) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}" if isinstance(value, float) else f"{value:,}"


def _row(cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _not_measured(row: dict) -> str:
    return f"{row['status']}: {row.get('note', '')[:160]}"


def _step_lines(rows: list[dict], settings: dict) -> list[str]:
    out = [f"### Training step: {settings['size']} (L/H/A/F, both halves), batch "
           f"{settings['batch_size']}, length-bucketed spa_eng batches", "",
           _row(["implementation", "step (s)", "target tokens/s", "params", "peak RSS (MB)"]),
           _row(["---"] * 5)]
    for r in rows:
        if r["status"] == "ok":
            out.append(_row([LABELS[r["implementation"]], _fmt(r["step_time_s"], 3),
                             _fmt(r["target_tokens_per_s"], 0), _fmt(r["params"]),
                             _fmt(r["peak_rss_mb"], 0)]))
        else:
            out.append(_row([LABELS[r["implementation"]], _not_measured(r), "", "", ""]))
    return out + [""]


def _bleu_lines(rows: list[dict], heading: str) -> list[str]:
    out = [heading, "", _row(["model", "steps", "train (s)", "params", "dev BLEU",
                              "decoding"]), _row(["---"] * 6)]
    for r in rows:
        name = LABELS[r["implementation"]]
        if r["status"] != "ok":
            out.append(_row([name, _not_measured(r), "", "", "", ""]))
            continue
        for setting, d in r["decoded"].items():
            out.append(_row([name, _fmt(r["steps"]), _fmt(r["train_seconds"], 0),
                             _fmt(r["params"]), _fmt(d["bleu"]), setting]))
    return out + [""]


def markdown(results: dict) -> str:
    """The README block: machine, settings, one table per section, the targets."""
    m, s = results["machine"], results["settings"]
    lines = [f"Measured {m['date']} on **{m['cpu_model']}**, {m['usable_cores']} usable cores; "
             f"load average {m['load_average_start'][0]:.2f} at start, "
             f"{m['load_average_end'][0]:.2f} at end; total {results['total_seconds']:.0f} s. "
             f"Joint cased vocabulary: {results['vocab_size']:,} tokens; pairs cut to "
             f"{s['max_length']} pieces; "
             f"{'all' if not s['train_pairs'] else s['train_pairs']} training pairs, "
             f"{'all' if not s['dev_pairs'] else s['dev_pairs']} dev pairs."
             + (" **Smoke run: the numbers mean nothing.**" if s["smoke"] else ""), ""]
    if "step" in results:
        lines += _step_lines(results["step"], s)
    if "budget" in results:
        lines += _bleu_lines(results["budget"], (
            f"### Equal wall-clock: {s['budget_minutes']:g} minutes each, turns of "
            f"{s['turn_seconds']:g} s, batch {s['batch_size']}, bert-train at "
            + (f"{s['budget_size']} (peak learning rate {s['budget_learning_rate']:g}, "
               f"{s['budget_warmup_steps']} warm-up steps, dropout {s['budget_dropout']:g})"
               if "budget_size" in s else s["size"])))
    if "bert2bert" in results:
        lines += _bleu_lines(results["bert2bert"], (
            f"### BERT2BERT: MiniLM (L6/H384) warm started vs from scratch, "
            f"{s['b2b_steps']} steps each, MiniLM's uncased vocabulary"
            + (f", peak learning rate {s['b2b_learning_rate']:g} for both"
               if "b2b_learning_rate" in s else "")))
    if results.get("targets"):
        lines += ["### Targets", "", _row(["target", "measured", "goal", "met", "from"]),
                  _row(["---"] * 5)]
        for t in results["targets"]:
            met = "-" if t["met"] is None else ("yes" if t["met"] else "no")
            lines.append(_row([t["name"], "-" if t["value"] is None else
                               f"{t['value']:.2f}{t['unit']}", f">= {t['goal']}{t['unit']}",
                               met, t["detail"]]))
        lines.append("")
    return "\n".join(lines) + "\n"
