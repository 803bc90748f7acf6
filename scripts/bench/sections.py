"""The training sections (matmul peak, A/B comparison, cost growth) and the targets.

Each starts its workers, measures and returns JSON-ready dicts.
"""

import dataclasses
import statistics

from bench import finetune_section, measure, report
from bench import spec as spec_lib
from bench.progress import elapsed, say
from bench.worker import Worker
from bert_trainer import features

# Peers' sequences/s on the mini benchmark, quoted for this machine class (not measured here).
PEER_FIGURES = {"keras_hub_tf": 11.0, "keras_hub_xla": 16.0, "model_garden": 14.0,
                "pytorch_transformers": 18.0, "pytorch_compiled": 19.0}
GOALS = {"vs_keras_hub": 1.5, "vs_pytorch_compiled": 1.0, "mfu": 65.0,
         "pipeline_vs_step": 5.0, "tokenizer_vs_tokenizers": 1.0}
GROWTH_SAFETY = 1.5  # Long sequences run at a lower MFU than the FLOPs ratio predicts.


def _step_worker(plan, implementation: str, step: spec_lib.StepSpec) -> Worker:
    return Worker(implementation, {"step": step.to_json()}, plan.log_path)


def _real_token_fraction(step: spec_lib.StepSpec) -> float:
    batches = spec_lib.make_batches(step, 1)
    return float(batches[0][features.INPUT_MASK].mean())


def _matmul_gflops(outcome: dict) -> float:
    return statistics.median(r["flops"] / r["seconds"] / 1e9 for r in outcome["runs"])


def record_peak(peak: dict, key: str, gflops: float | None) -> None:
    """Stores one matmul median and keeps `peak["gflops"]` = the highest one.

    The highest is the reference for MFU: other load on the machine can only lower a
    measurement, so the highest is the closest to what the hardware does.
    """
    peak[key] = gflops
    values = [peak.get(k) for k in ("gflops_start", "gflops_during_compare", "gflops_end")]
    peak["gflops"] = max((v for v in values if v), default=None)


def matmul_peak(plan, peak: dict | None = None, key: str = "gflops_start",
                dtype: str = "float32") -> dict:
    """Median matmul GFLOP/s of `matmul_repeats` products, recorded under `key`.

    float32 is the MFU reference (`peak["gflops"]`, the highest of its medians); a bfloat16
    measurement is stored under its own key only (`gflops_bfloat16`), for bfloat16 steps.
    """
    peak = peak if peak is not None else {"n": plan.matmul_n, "repeats": plan.matmul_repeats}
    with Worker("matmul", {"n": plan.matmul_n, "dtype": dtype}, plan.log_path) as worker:
        outcome = measure.alternate([worker], warmup=1, rounds=plan.matmul_repeats, steps=1)[0]
    if "error" in outcome:
        say(f"matmul peak failed: {outcome['error']}")
        peak.setdefault("errors", []).append(outcome["error"])
        return peak
    if dtype == "float32":
        record_peak(peak, key, _matmul_gflops(outcome))
    else:
        peak[key] = _matmul_gflops(outcome)
    say(f"matmul {plan.matmul_n} {dtype}: {peak[key]:.1f} GFLOP/s")
    return peak


def compare(plan, peak: dict, floors: list | None = None) -> list[dict]:
    """bert-train vs keras-hub (and their XLA variants) on the main step, A/B/A/B.

    A matmul worker takes a turn in every round too, so `peak["gflops_during_compare"]` is
    measured under the same conditions as the steps. So do the matmul floors (`bench.floor`:
    every matrix product of bert-train's step alone), one per precision the variants train
    in; their entries are appended to `floors` and each bert-train row gets `matmul_share`,
    its floor's time over its step time.
    """
    steps, workers = _variant_workers(plan, "compare", plan.main, plan.variants, say)
    workers.append(Worker("matmul", {"n": plan.matmul_n}, plan.log_path))
    matmuls = max(1, plan.matmul_repeats // 2)
    dtypes = ["float32"] + sorted({p for *_, p in plan.variants if p})
    rows = 1 + plan.main.max_predictions  # bert-train's last layer: [CLS] + the predictions
    # ... and its masked LM at the weighted predictions only (the batches' mean, rounded).
    mlm_rows = round(spec_lib.computed_mlm_rows(plan.main))
    # ... and its layers on the real tokens only (packed).
    tokens = round(spec_lib.computed_tokens(plan.main))
    workers += [Worker("matmul_floor", {"step": plan.main.to_json(), "dtype": dtype,
                                        "last_layer_rows": rows, "mlm_rows": mlm_rows,
                                        "tokens": tokens},
                       plan.log_path)
                for dtype in dtypes]
    try:
        outcomes = measure.alternate(
            workers, warmup=plan.warmup, rounds=plan.rounds,
            steps=[plan.steps] * len(steps) + [matmuls] + [plan.steps] * len(dtypes))
    finally:
        for worker in workers:
            worker.close()
    matmul_outcome = outcomes[len(steps)]
    if "error" not in matmul_outcome:
        record_peak(peak, "gflops_during_compare", _matmul_gflops(matmul_outcome))
    fraction = _real_token_fraction(plan.main)
    entries = [measure.training_entry(step, impl, outcome, plan.steps, "compare", fraction)
               for (impl, *_), step, outcome in zip(plan.variants, steps,
                                                    outcomes[:len(steps)], strict=True)]
    measured_floors = [_floor_entry(dtype, outcome, plan.steps)
                       for dtype, outcome in zip(dtypes, outcomes[len(steps) + 1:], strict=True)]
    attach_floors(entries, measured_floors)
    if floors is not None:
        floors += measured_floors
    for e in entries:
        say(f"  {e['implementation']} jit={e['jit_compile']} {e['mixed_precision']}: "
            f"{e['status']} "
            f"{e.get('sequences_per_s', 0):.1f} seq/s {e.get('note', '')[:200]}")
    return entries


def _floor_entry(dtype: str, outcome: dict, steps: int) -> dict:
    """One row of results["matmul_floor"] from a floor worker's outcome."""
    if "error" in outcome:
        return {"dtype": dtype, "status": "failed", "error": outcome["error"]}
    info = outcome["build"]["info"]
    times = [r["seconds"] / steps for r in outcome["runs"]]
    seconds = measure.median_unit_seconds(outcome["runs"], units=steps)
    return {"dtype": dtype, "status": "ok", "products": info["products"],
            "flops_per_step": info["flops_per_step"], "step_time_s": seconds,
            "step_times_s": times, "gflops": info["flops_per_step"] / seconds / 1e9}


def attach_floors(entries: list[dict], floors: list[dict]) -> None:
    """Gives each bert-train row without XLA the time of its precision's matmul floor.

    `matmul_share` = floor time / step time: the part of the step its matrix products alone
    take. Only where the floor does the FLOPs the step executes (to 0.1 %: the floor's masked
    LM runs the mean of the batches' row counts, rounded to a whole row).
    """
    by_dtype = {f["dtype"]: f for f in floors if f["status"] == "ok"}
    for e in entries:
        floor = by_dtype.get(e.get("mixed_precision") or "float32")
        if (e["implementation"] != "bert_train" or e["status"] != "ok" or e["jit_compile"]
                or floor is None or not same_flops(floor["flops_per_step"],
                                                   e["executed_flops_per_step"])):
            continue
        e["matmul_floor_s"] = floor["step_time_s"]
        e["matmul_share"] = floor["step_time_s"] / e["step_time_s"]


def same_flops(a: float, b: float) -> bool:
    """Equal to 0.1 % (a floor with the step's mean masked-LM rows rounded to a whole row)."""
    return abs(a - b) <= 1e-3 * max(abs(a), abs(b))


def _best(entries: list[dict], implementation: str, group: str = "compare") -> dict | None:
    ok = [e for e in entries if e["group"] == group and e["status"] == "ok"
          and e["implementation"] == implementation]
    return max(ok, key=lambda e: e["sequences_per_s"]) if ok else None


def base_compare(plan) -> list[dict]:
    """BERT-base pretraining (the `base` section): bert-train vs keras-hub, alternating.

    The compare section's method on `plan.base` (BERT-base, batch 8 x 128 in a full run) with
    `plan.base_variants`, without the matmul and floor workers.
    """
    steps, workers = _variant_workers(plan, "base", plan.base, plan.base_variants, say)
    schedule = plan.base_schedule
    try:
        outcomes = measure.alternate(workers, warmup=schedule["warmup"],
                                     rounds=schedule["rounds"], steps=schedule["steps"])
    finally:
        for worker in workers:
            worker.close()
    fraction = _real_token_fraction(plan.base)
    entries = [measure.training_entry(step, impl, outcome, schedule["steps"], "base", fraction)
               for (impl, *_), step, outcome in zip(plan.base_variants, steps, outcomes,
                                                    strict=True)]
    for e in entries:
        say(f"  {report.label(e)}: {e['status']} {e.get('sequences_per_s', 0):.2f} seq/s "
            f"{e.get('note', '')[:200]}")
    return entries


def _growth_points(plan, options: dict) -> list[tuple[str, spec_lib.StepSpec]]:
    base_seq = plan.growth_seqs[0]
    main = dataclasses.replace(plan.main, **options)
    points = [("size_growth", dataclasses.replace(main, size=spec_lib.SIZES[name],
                                                  seq_length=base_seq))
              for name in plan.growth_sizes]
    points += [("seq_growth", dataclasses.replace(main, seq_length=seq))
               for seq in plan.growth_seqs]
    return points


def _measure_alone(plan, implementation, step, group) -> dict:
    rounds = max(2, plan.rounds // 2)
    with _step_worker(plan, implementation, step) as worker:
        outcome = measure.alternate([worker], warmup=1, rounds=rounds, steps=1)[0]
    return measure.training_entry(step, implementation, outcome, 1, group,
                                  _real_token_fraction(step))


def _key(implementation: str, step: spec_lib.StepSpec) -> tuple:
    return (implementation, step.jit_compile, step.mixed_precision, step.size.name,
            step.seq_length)


def _estimate_s(plan, step: spec_lib.StepSpec, ref: dict | None) -> float:
    """Seconds a growth point will take, from the measured main step scaled by FLOPs."""
    if ref is None:
        return 0.0
    steps = 1 + max(2, plan.rounds // 2)
    scale = spec_lib.train_flops(step) / ref["flops_per_step"]
    fixed = ref["build_s"] + (ref["warmup_s"] or 0.0)  # imports, build, tracing/compiling
    return fixed + GROWTH_SAFETY * steps * scale * ref["step_time_s"]


def _options(entry: dict | None) -> dict:
    """The StepSpec options (XLA, precision) of a measured entry; defaults for None."""
    if entry is None:
        return {"jit_compile": False, "mixed_precision": None}
    return {"jit_compile": entry["jit_compile"], "mixed_precision": entry["mixed_precision"]}


def _growth_variant(measured: list[dict]) -> tuple[str, dict]:
    """bert-train's fastest compare variant; keras-hub when bert-train was measured and failed."""
    best = _best(measured, "bert_train")
    if best:
        return "bert_train", _options(best)
    if any(e["implementation"] == "bert_train" for e in measured):
        return "keras_hub", _options(None)
    return "bert_train", _options(None)


def growth(plan, measured: list[dict]) -> list[dict]:
    """Step time over sizes (at the first seq) and sequence lengths (at the main size).

    One process per point: warm-up 1, then max(2, rounds // 2) single-step rounds. The point
    shared with the compare section is not measured twice. A point whose estimated time
    (`_estimate_s`) would overrun `plan.budget_s` is skipped and says so.
    """
    implementation, options = _growth_variant(measured)
    cache = {_key(e["implementation"], dataclasses.replace(
        plan.main, size=spec_lib.SIZES[e["size"]], seq_length=e["seq_length"],
        **_options(e))): e
        for e in measured if e["group"] == "compare" and e["status"] == "ok"}
    ref = cache.get(_key(implementation, dataclasses.replace(plan.main, **options)))
    entries = []
    for group, step in _growth_points(plan, options):
        key = _key(implementation, step)
        if key not in cache:
            estimate = _estimate_s(plan, step, ref)
            if elapsed() + estimate > plan.budget_s:
                cache[key] = measure.training_entry(step, implementation, {
                    "error": f"skipped: ~{estimate:.0f} s would pass --budget_s="
                             f"{plan.budget_s:.0f}"}, 1, group, 1.0)
            else:
                say(f"growth: {implementation} {step.size.name} seq {step.seq_length}")
                cache[key] = _measure_alone(plan, implementation, step, group)
        entries.append(dict(cache[key], group=group))
    _add_relative(entries, plan)
    return entries


def _add_relative(entries: list[dict], plan) -> None:
    ref = next((e for e in entries if e["size"] == plan.main.size.name and e["status"] == "ok"
                and e["seq_length"] == plan.growth_seqs[0]), None)
    for e in entries:
        if ref and e["status"] == "ok":
            e["relative_step_time"] = e["step_time_s"] / ref["step_time_s"]
            e["note"] = f"{e['relative_step_time']:.2f}x the {ref['size']}/{ref['seq_length']} step"


def step_consumption(entries: list[dict]) -> dict | None:
    """Sequences/s the training step consumes: bert-train's fastest, else keras-hub's."""
    best = _best(entries, "bert_train") or _best(entries, "keras_hub")
    if best is None:
        return None
    return {"implementation": best["implementation"], **_options(best),
            "sequences_per_s": best["sequences_per_s"]}


def target(name: str, value, goal: float, unit: str = "x", detail: str = "") -> dict:
    return {"name": name, "value": value, "goal": goal, "unit": unit, "detail": detail,
            "met": None if value is None else bool(value >= goal)}


def _base_targets(train: list[dict]) -> list[dict]:
    """BERT-base rows: bert-train's fastest variant and its float32 one against keras-hub's."""
    if not any(e["group"] == "base" for e in train):
        return []
    base = report.keras_hub_baseline(train, group="base")
    ours = _best(train, "bert_train", group="base")
    fp32 = _best([e for e in train if not e["mixed_precision"]], "bert_train", group="base")
    size = next(e for e in train if e["group"] == "base")
    name = f"{size['size']} pretraining b{size['batch_size']} x s{size['seq_length']}"
    rows = []
    for label_, entry in ((name, ours), (f"{name} fp32", fp32)):
        rows.append(target(
            f"{label_}: bert-train / keras-hub TF step (seq/s)",
            entry["sequences_per_s"] / base["sequences_per_s"] if entry and base else None,
            GOALS["vs_keras_hub"], detail=f"{report.label(entry)} vs keras-hub"
            if entry and base else "not measured"))
    return rows


def targets(results: dict) -> list[dict]:
    """The speed targets against what this run measured (None where not measured).

    bert-train counts with its fastest compare variant (named in each row's detail), against
    keras-hub's default float32 TF step, and the speed target again with float32 alone. The
    quoted peer figures are for the mini config, so a --smoke run leaves that row empty. The
    BERT-base and fine-tuning rows follow when their sections ran.
    """
    train = results.get("training", [])
    ours = _best(train, "bert_train")
    base = report.keras_hub_baseline(train)
    ours_sps = ours["sequences_per_s"] if ours else None
    quoted = ours_sps / PEER_FIGURES["pytorch_compiled"] if (
        ours and not results["settings"]["smoke"]) else None
    pipe, tok = results.get("input_pipeline") or {}, results.get("tokenizer") or {}
    variant = report.label(ours) if ours else ""
    fp32 = _best([e for e in train if not e["mixed_precision"]], "bert_train")
    bf16 = _best([e for e in train if e["mixed_precision"] == "bfloat16"], "bert_train")
    rows = [
        target("bert-train / keras-hub TF step (seq/s)",
               ours_sps / base["sequences_per_s"] if ours and base else None,
               GOALS["vs_keras_hub"], detail=f"{variant} vs keras-hub" if base else ""),
        target("bert-train fp32 / keras-hub TF step (seq/s)",
               fp32["sequences_per_s"] / base["sequences_per_s"] if fp32 and base else None,
               GOALS["vs_keras_hub"], detail=f"{report.label(fp32)} (fp32) vs keras-hub"
               if fp32 and base else ""),
        target("bert-train / PyTorch compiled figure (19 seq/s, quoted)", quoted,
               GOALS["vs_pytorch_compiled"], detail=variant),
        target("bert-train MFU vs same-run matmul peak",
               100 * fp32["mfu"] if fp32 and fp32.get("mfu") else None, GOALS["mfu"], " %",
               detail=(f"{report.label(fp32)} (fp32), executed FLOPs vs the fp32 peak"
                        if fp32 else "")),
        target("bert-train bf16 MFU vs same-run bf16 matmul peak",
               100 * bf16["mfu_bfloat16"] if bf16 and bf16.get("mfu_bfloat16") else None,
               GOALS["mfu"], " %",
               detail=f"{report.label(bf16)}, executed FLOPs" if bf16 else "not measured"),
        target("input pipeline / step consumption", pipe.get("ratio_to_step"),
               GOALS["pipeline_vs_step"], detail=variant),
        target("bert-train Tokenizer / tokenizers (tokens/s)", tok.get("ratio"),
               GOALS["tokenizer_vs_tokenizers"], detail="all cores"),
    ]
    finetune = finetune_section.targets(results.get("finetune") or [], target)
    return rows + ([dict(t, section="base") for t in _base_targets(train)]
                   + [dict(t, section="finetune") for t in finetune])


def _variant_workers(plan, section: str, step, variants, say):
    """(steps, workers): `step` in each variant's (jit, precision), one step worker each."""
    steps = [dataclasses.replace(step, jit_compile=jit, mixed_precision=precision)
             for _, jit, precision in variants]
    say(f"{section}: building {len(steps)} variants of {step.size.name} "
        f"b{step.batch_size} s{step.seq_length}")
    workers = [_step_worker(plan, impl, s) for (impl, *_), s in zip(variants, steps, strict=True)]
    return steps, workers
