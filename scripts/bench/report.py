"""Describes the machine and renders results.json as the markdown tables of benchmarks/README.md."""

import datetime
import importlib.metadata
import json
import os
import platform
import sys
import time

from bench import isa

BEGIN, END = "<!-- benchmark-results:begin -->", "<!-- benchmark-results:end -->"
# The base and finetune sections have their own block, so `--only=base,finetune --table`
# leaves the other results in place.
FINETUNE_BEGIN = "<!-- benchmark-finetune:begin -->"
FINETUNE_END = "<!-- benchmark-finetune:end -->"
FINETUNE_SECTIONS = ("base", "finetune")
LABELS = {"bert_train": "bert-train", "bert_train_tf_ops": "bert-train, TF ops only",
          "keras_hub": "keras-hub"}
PACKAGES = ("tensorflow", "keras", "keras-hub", "tensorflow-text", "tokenizers", "numpy")


def _cpuinfo() -> dict:
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return info


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def machine_info() -> dict:
    """CPU model, cores, bf16 support, memory, library versions and the load average now."""
    cpu = _cpuinfo()
    flags = set(cpu.get("flags", "").split())
    mem_kib = None
    if os.path.exists("/proc/meminfo"):
        with open("/proc/meminfo") as f:
            mem_kib = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
    return {
        "cpu_model": cpu.get("model name", platform.processor() or "unknown"),
        "logical_cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "bf16_instructions": sorted(flags & {"avx512_bf16", "amx_bf16"}),
        "isa": isa.isa_info(),  # what a row ran on: matmul ISA, AMX or not, oneDNN's state
        "memory_gib": round(mem_kib / 2**20, 1) if mem_kib else None,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": {p: _version(p) for p in PACKAGES},
        "load_average_start": os.getloadavg(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }


def _fmt(value, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def label(entry: dict) -> str:
    """Display name of a training variant, e.g. "bert-train + XLA"."""
    name = LABELS.get(entry["implementation"], entry["implementation"])
    name += " + XLA" if entry["jit_compile"] else ""
    return name + (f" + {entry['mixed_precision']}" if entry.get("mixed_precision") else "")


def _row(cells) -> str:
    return "| " + " | ".join(cells) + " |"


def _training_table(entries: list[dict], first_col: str, first) -> list[str]:
    lines = [_row([first_col, "step (s)", "seq/s", "tokens/s", "GFLOP/s", "MFU",
                   "peak RSS (MiB)", "note"]),
             _row(["---"] * 8)]
    for e in entries:
        if e["status"] != "ok":
            lines.append(_row([first(e)] + ["-"] * 6 + [f"{e['status']}: {e['note'][:120]}"]))
            continue
        mfu = f"{100 * e['mfu']:.0f} %" if e.get("mfu") is not None else "-"
        lines.append(_row([
            first(e), _fmt(e["step_time_s"], 3), _fmt(e["sequences_per_s"]),
            _fmt(round(e["tokens_per_s"])), _fmt(e["gflops"]), mfu,
            _fmt(round(e["peak_rss_mb"])), e.get("note", "")]))
    return lines


def _targets_table(targets: list[dict]) -> list[str]:
    lines = [_row(["target", "measured", "goal", "met", "from"]), _row(["---"] * 5)]
    for t in targets:
        measured = "-" if t["value"] is None else f"{t['value']:.2f}{t['unit']}"
        met = "-" if t["met"] is None else ("yes" if t["met"] else "no")
        lines.append(_row([t["name"], measured, f">= {t['goal']}{t['unit']}", met,
                           t["detail"]]))
    return lines


def keras_hub_baseline(train: list[dict], group: str = "compare") -> dict | None:
    """keras-hub's default float32 TF step of a section (the targets' baseline)."""
    return next((e for e in train if e["group"] == group and e["status"] == "ok"
                 and e["implementation"] == "keras_hub" and not e["jit_compile"]
                 and not e["mixed_precision"]), None)


def _floor_lines(floors: list[dict], train: list[dict]) -> list[str]:
    """What bert-train's step would take with only its matrix products left (bench/floor.py)."""
    ok = [f for f in floors if f["status"] == "ok"]
    if not ok:
        return []
    parts = []
    for floor in ok:
        part = (f"{floor['dtype']} **{floor['step_time_s']:.3f} s** per step "
                f"({_fmt(floor['gflops'])} GFLOP/s)")
        step = next((e for e in train if "matmul_share" in e
                     and (e["mixed_precision"] or "float32") == floor["dtype"]), None)
        if step:
            part += (f", {100 * step['matmul_share']:.0f} % of the {label(step)} step "
                     f"({step['step_time_s']:.3f} s)")
        parts.append(part)
    out = [f"Matmul floor: bert-train's step with only its matrix products left (all "
           f"{ok[0]['products']} of them, forward and backward, on its shapes and distinct "
           f"operands; `scripts/bench/floor.py`), timed in the same rounds: "
           f"{'; '.join(parts)}. The rest of a step is elementwise work (dropout, LayerNorm, "
           "GELU, softmax, the loss, the optimizer update) and scheduling."]
    base = keras_hub_baseline(train)
    fp32 = next((f for f in ok if f["dtype"] == "float32"), None)
    if base and fp32:
        out[-1] += (f" A float32 step of nothing but these products would be "
                    f"{base['step_time_s'] / fp32['step_time_s']:.2f}x keras-hub's step.")
    return out + [""]


def _kernel_lines(train: list[dict]) -> list[str]:
    """What the fused CPU kernels buy: bert-train against itself on TensorFlow's own ops."""
    def find(implementation):
        return next((e for e in train if e["group"] == "compare" and e["status"] == "ok"
                     and e["implementation"] == implementation and not e["jit_compile"]
                     and not e["mixed_precision"]), None)

    fused, tf_ops = find("bert_train"), find("bert_train_tf_ops")
    if not (fused and tf_ops):
        return []
    return [f"Fused CPU kernels (`bert_trainer/kernels`: dropout, LayerNorm, GELU, attention "
            f"probabilities, attention head layout and token packing, MLM cross-entropy, "
            f"AdamW): the float32 step takes "
            f"**{fused['step_time_s']:.3f} s** with them and {tf_ops['step_time_s']:.3f} s on "
            f"TensorFlow's own ops (`BERT_TRAIN_FUSED_KERNELS=off`), same rounds: "
            f"**{tf_ops['step_time_s'] / fused['step_time_s']:.2f}x**.", ""]


def _isa_text(machine: dict) -> str:
    """"ISA: ... . " for a header (results written before the ISA was recorded: nothing)."""
    return f"ISA: {isa.isa_line(machine['isa'])}. " if machine.get("isa") else ""


def _measured_line(results: dict, settings: str) -> str:
    m = results["machine"]
    smoke = " (SMOKE RUN: tiny sizes, numbers meaningless)" if results["settings"]["smoke"] else ""
    versions = ", ".join(f"{k} {v}" for k, v in m["versions"].items() if v)
    return (f"Measured {m['date']} on **{m['cpu_model']}**, {m['usable_cores']} usable cores "
            f"({m['logical_cores']} logical), {m['memory_gib']} GiB, bf16 instructions: "
            f"{', '.join(m['bf16_instructions']) or 'none'}; {versions}. {_isa_text(m)}"
            f"Load average "
            f"{m['load_average_start'][0]:.2f} at start, {m['load_average_end'][0]:.2f} at end. "
            f"Settings: {settings}{smoke}.")


def markdown(results: dict) -> str:
    """The generated part of benchmarks/README.md (all but the base and finetune sections)."""
    s = results["settings"]
    out = [_measured_line(results, f"warm-up {s['warmup']}, {s['rounds']} rounds x "
                                   f"{s['steps']} steps"), ""]
    peak = results.get("matmul_peak") or {}
    if peak.get("gflops"):
        parts = ", ".join(f"{when} {_fmt(peak.get(key))}" for when, key in (
            ("start", "gflops_start"), ("during the A/B rounds", "gflops_during_compare"),
            ("end", "gflops_end")) if peak.get(key))
        out += [f"fp32 `tf.matmul` peak ({peak['n']}x{peak['n']}): **{_fmt(peak['gflops'])} "
                f"GFLOP/s**, the highest of the medians measured ({parts}); MFU is relative "
                "to it."]
        if peak.get("gflops_bfloat16"):
            out += [f"bfloat16 `tf.matmul` peak: **{_fmt(peak['gflops_bfloat16'])} GFLOP/s** "
                    "(start); the bfloat16 rows' MFU against it is in the targets."]
        out += [""]
    train = results.get("training", [])
    out += _floor_lines(results.get("matmul_floor") or [], train)
    out += _kernel_lines(train)
    compare = [e for e in train if e["group"] == "compare"]
    if compare:
        out += [_pretraining_heading(compare[0], "AdamW, float32 unless marked"), ""]
        out += _training_table(compare, "implementation", label) + [""]
    targets = [t for t in results.get("targets") or [] if t.get("section", "main") == "main"]
    if targets:
        out += ["### Targets", ""] + _targets_table(targets) + [""]
    for group, title, first in (
            ("size_growth", "by model size", lambda e: (
                f"{e['size']} L{e['num_layers']}/H{e['hidden_size']}, seq {e['seq_length']}")),
            ("seq_growth", "by sequence length", lambda e: (
                f"{e['size']}, seq {e['seq_length']}"))):
        rows = [e for e in train if e["group"] == group]
        if rows:
            out += [f"### How cost grows {title} ({label(rows[0])}, batch "
                    f"{rows[0]['batch_size']})", ""]
            out += _training_table(rows, "size, seq", first) + [""]
    out += _side_tables(results)
    return "\n".join(out).rstrip() + "\n"


def finetune_markdown(results: dict) -> str:
    """The base and finetune sections' block of benchmarks/README.md, with their targets."""
    ft = results["settings"].get("finetune") or {}
    base = results["settings"].get("base")
    torch_row = next((e for e in results.get("finetune") or []
                      if e["implementation"] == "pytorch" and e["status"] == "ok"), None)
    parts = []
    if ft:
        steps = ", ".join(f"{c['label']} {c['steps']}" for c in ft["cases"])
        parts.append(f"fine-tuning warm-up {ft['warmup']} steps, then {ft['rounds']} "
                     f"alternating rounds of the case's steps per side ({steps})")
    if base:
        parts.append(f"BERT-base warm-up {base['warmup']}, {base['rounds']} rounds x "
                     f"{base['steps']} steps")
    if torch_row:
        info = torch_row["info"]
        parts.append(f"PyTorch {info['torch']}, transformers {info['transformers']} "
                     f"({info['threads']} threads, attention {info['attention']})")
    settings = "; ".join(parts)
    out = [_measured_line(results, settings), ""]
    rows = [e for e in results.get("training", []) if e["group"] == "base"]
    if rows:
        out += [_pretraining_heading(rows[0], "the compare section's method"), ""]
        out += _training_table(rows, "implementation", label) + [""]
    out += _finetune_lines(results.get("finetune") or [])
    targets = [t for t in results.get("targets") or [] if t.get("section") in FINETUNE_SECTIONS]
    if targets:
        out += ["### Targets: BERT-base and fine-tuning", ""] + _targets_table(targets) + [""]
    return "\n".join(out).rstrip() + "\n"


FINETUNE_LABELS = {"bert_train": "bert-train", "pytorch": "PyTorch, dynamic padding"}


def _finetune_lines(entries: list[dict]) -> list[str]:
    """The `finetune` table: one row per task and implementation."""
    if not entries:
        return []
    out = ["### Fine-tuning: MiniLM (all-MiniLM-L6-v2), the `finetune` task and trainer vs "
           "PyTorch + transformers padding each batch to its longest", "",
           _row(["task", "batch x seq", "implementation", "examples/s", "step (s)",
                 "real tokens/s", "padding", "mean padded length", "peak RSS (MiB)", "note"]),
           _row(["---"] * 10)]
    for e in entries:
        first = [e["label"], f"{e['batch_size']} x {e['seq_length']}",
                 FINETUNE_LABELS.get(e["implementation"], e["implementation"])]
        if e["status"] != "ok":
            out.append(_row(first + ["-"] * 6 + [f"{e['status']}: {e['note'][:120]}"]))
            continue
        padding = e.get("padding_fraction")
        note = (f"{e['timed_traces']} tf.function trace(s) in the timed rounds"
                if e.get("timed_traces") else "")
        out.append(_row(first + [
            _fmt(e["examples_per_s"]), _fmt(e["step_time_s"], 3),
            _fmt(round(e["tokens_per_s"])) if "tokens_per_s" in e else "-",
            "-" if padding is None else f"{100 * padding:.0f} %",
            _fmt(e.get("mean_padded_length")), _fmt(round(e["peak_rss_mb"])), note]))
    return out + [""]


def _side_tables(results: dict) -> list[str]:
    out = []
    pipe = results.get("input_pipeline")
    if pipe:
        out += ["### Input pipeline (TFRecord -> masked batch)", ""]
        if pipe["status"] == "ok":
            out += [_row(["examples/s", "consumed by the step (seq/s)", "ratio", "batch x seq"]),
                    _row(["---"] * 4),
                    _row([_fmt(pipe["examples_per_s"]), _fmt(pipe.get("step_sequences_per_s")),
                          _fmt(pipe.get("ratio_to_step"), 1) + "x",
                          f"{pipe['batch_size']} x {pipe['seq_length']}"]), ""]
        else:
            out += [f"{pipe['status']}: {pipe['note']}", ""]
    tok = results.get("tokenizer")
    if tok:
        out += ["### Tokenizer (same texts, same vocab, word pieces without [CLS]/[SEP])", ""]
        if tok["status"] == "ok":
            out += [_row(["implementation", "tokens/s", "texts/s"]), _row(["---"] * 3)]
            for name, r in tok["implementations"].items():
                out.append(_row([name, _fmt(round(r["tokens_per_s"])),
                                 _fmt(round(r["texts_per_s"]))]))
            out += ["", f"{tok['texts']:,} texts ({tok['source']}); identical ids for "
                    f"{100 * tok['agreement']:.2f} % of them. bert-train / tokenizers: "
                    f"{tok['ratio']:.2f}x on all cores, {tok['ratio_single_thread']:.2f}x on "
                    "one thread.", ""]
        else:
            out += [f"{tok['status']}: {tok['note']}", ""]
    return out


def write_json(path: str, record, *, indent: int = 2) -> None:
    """Writes `record` as JSON aside, then renames it into place: a results file appears only
    complete (every harness writes its results this way)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    aside = f"{path}.tmp-{os.getpid()}"
    with open(aside, "w", encoding="utf-8") as f:
        f.write(json.dumps(record, indent=indent) + "\n")
    os.replace(aside, path)


def harness_main(argv, *, name: str, parse_args, run, publish, check=None) -> int:
    """The main of a benchmark harness: flags, a one-line check, the run, its results.

    Args:
      argv: the command line (None: sys.argv[1:]).
      name: the harness, named in its error line.
      parse_args: argv -> the parsed flags (an `argparse.Namespace` with `output`).
      run: flags -> the results record (a dict); its wall time is added as "wall_minutes".
      publish: (flags, record) -> exit code or None (0), after the record is written to
        `flags.output`: tables, plots, the summary printed.
      check: flags -> a one-line problem or None; a problem exits 2 before anything runs.

    Returns:
      The exit code.
    """
    args = parse_args(sys.argv[1:] if argv is None else argv)
    problem = check(args) if check else None
    if problem:
        print(f"{name}: error: {problem}", file=sys.stderr)
        return 2
    started = time.time()
    record = run(args)
    record["wall_minutes"] = round((time.time() - started) / 60, 1)
    write_json(args.output, record)
    return publish(args, record) or 0


def update_readme(path: str, table: str, begin: str = BEGIN, end: str = END) -> None:
    """Replaces the text between the markers `begin`/`end` of `path` (appends them if absent)."""
    text = ""
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            text = f.read()
    block = f"{begin}\n{table}{end}"
    if begin in text and end in text:
        head, _, rest = text.partition(begin)
        _, _, tail = rest.partition(end)
        text = head + block + tail
    else:
        text = (text.rstrip() + "\n\n" if text else "") + block + "\n"
    tmp = f"{path}.tmp-{os.getpid()}"  # written aside, then renamed: never half a README
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def _pretraining_heading(entry: dict, how: str) -> str:
    """The heading over a table of pretraining steps of one size, batch and sequence."""
    return (f"### Pretraining step: {entry['size']} (L{entry['num_layers']}/"
            f"H{entry['hidden_size']}), batch {entry['batch_size']} x seq {entry['seq_length']}, "
            f"{entry['max_predictions']} MLM predictions + NSP, {how}")
