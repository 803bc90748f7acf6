"""The bf16-vs-fp32 loss-curve comparison (bench/bf16_curve.py): the verdict, the plot and the
markdown of benchmarks/README.md's section "bfloat16 against float32: loss curve".

The tolerance is fixed here, before any run: bfloat16's mean masked-LM loss over the last
WINDOW steps within TOLERANCE (relative) of float32's, and every bfloat16 loss finite. Why 2 %:
bfloat16 keeps 8 bits of mantissa (about 0.4 % relative rounding per value) in activations and
matmul inputs while the weights, the optimizer and the loss stay float32 (Keras'
"mixed_bfloat16" policy), so the per-step noise averages out over a window of 200 steps; a
systematic error (a loss or softmax computed in bfloat16, a layer norm losing its variance)
shows up as a persistent gap of several percent or as a NaN. A float32 run with another seed
(`--reference_seed`) gives the seed-to-seed gap for scale; it is reported, not part of the
verdict.
"""

import math
import statistics

from bench import isa

TOLERANCE = 0.02
WINDOW = 200
TAG = "mlm_loss"
BASE, OTHER = "float32", "bfloat16"


def _curve(results: dict, run: str, tag: str = TAG) -> tuple[list[int], list[float]]:
    curve = results["runs"].get(run, {}).get("curves", {}).get(tag) or {}
    return list(curve.get("steps", [])), list(curve.get("values", []))


def _window_mean(steps, values, last_step: int, window: int) -> float | None:
    kept = [v for s, v in zip(steps, values, strict=True) if s > last_step - window]
    return statistics.fmean(kept) if kept else None


def _step_time(run: dict) -> float | None:
    timed = run.get("timed_intervals") or []
    return statistics.median(timed) if timed else None


def compare(results: dict, tolerance: float, window: int) -> dict:
    """The verdict and the numbers behind it.

    Returns:
      {"tolerance", "window", "complete" (both runs reached the last step with exit 0),
      "finite", "float32_window_mean", "bfloat16_window_mean", "relative_gap" (bf16 / fp32 -
      1), "holds", "max_pointwise_gap" (largest |relative gap| of one point after warmup),
      "reference" (the other-seed run's gap, or None), "step_time_s" per run, "speedup"
      (float32 step time / bfloat16's), and "verdict" (one line)}.
    """
    steps = results["settings"]["steps"]
    runs = results["runs"]
    complete = all(
        all(seg["exit_code"] == 0 for seg in runs[name]["segments"])
        and _curve(results, name)[0][-1:] == [steps] for name in (BASE, OTHER))
    means, finite = {}, True
    for name in (BASE, OTHER):
        s, v = _curve(results, name)
        finite = finite and bool(v) and all(math.isfinite(x) for x in v)
        means[name] = _window_mean(s, v, steps, window) if finite else None
    gap = (means[OTHER] / means[BASE] - 1.0) if finite and means[BASE] else None
    (s32, v32), (s16, v16) = _curve(results, BASE), _curve(results, OTHER)
    by_step = dict(zip(s32, v32, strict=True))
    pointwise = [abs(v / by_step[s] - 1.0) for s, v in zip(s16, v16, strict=True)
                 if s in by_step and s > min(steps // 5, 200) and by_step[s]]
    reference = None
    for name, run in runs.items():
        if name not in (BASE, OTHER):
            rs, rv = _curve(results, name)
            mean = _window_mean(rs, rv, steps, window) if rv and rs[-1] == steps else None
            reference = {"run": name, "seed": run["seed"], "window_mean": mean,
                         "relative_gap": (mean / means[BASE] - 1.0)
                         if mean is not None and means[BASE] else None}
    times = {name: _step_time(run) for name, run in runs.items()}
    speedup = (times[BASE] / times[OTHER]) if times.get(BASE) and times.get(OTHER) else None
    holds = bool(complete and finite and gap is not None and abs(gap) <= tolerance)
    if not complete:
        verdict = "INCOMPLETE: a run failed or stopped early (see segments / the log)"
    elif not finite:
        verdict = "FAILS: a non-finite loss"
    else:
        verdict = (f"{'HOLDS' if holds else 'FAILS'}: bfloat16's mean {TAG} over the last "
                   f"{window} steps is {gap:+.2%} of float32's (tolerance ±{tolerance:.0%})")
    return {"tolerance": tolerance, "window": window, "tag": TAG, "complete": complete,
            "finite": finite, "float32_window_mean": means[BASE],
            "bfloat16_window_mean": means[OTHER], "relative_gap": gap, "holds": holds,
            "max_pointwise_gap": max(pointwise) if pointwise else None,
            "reference": reference, "step_time_s": times, "speedup": speedup,
            "verdict": verdict}


def table_steps(steps: list[int], total: int) -> list[int]:
    """The rows of the README table: the first point, then every 100 steps (or 1/10th)."""
    every = max(total // 10, 1)
    return [s for i, s in enumerate(steps) if i == 0 or s % every == 0]


def _fmt(value, spec: str = ".4f") -> str:
    return "-" if value is None else format(value, spec)


def markdown(results: dict) -> str:
    """The section's generated text: the ISA line, settings, the curve table and the verdict."""
    c, s, m = results["comparison"], results["settings"], results["machine"]
    runs = results["runs"]
    names = [BASE, OTHER] + [n for n in runs if n not in (BASE, OTHER)]
    curves = {n: dict(zip(*_curve(results, n), strict=True)) for n in names}
    header = ["step"] + [f"{n} {TAG}" for n in names] + ["bf16 / fp32 - 1"]
    lines = [f"Measured {m['date']}, ISA: {isa.isa_line(m['isa'])}; {m['usable_cores']} usable "
             f"cores, load average {m['load_average_start'][0]:.2f} at start, "
             f"{m['load_average_end'][0]:.2f} at end"
             f"{' (SMOKE RUN: numbers meaningless)' if s['smoke'] else ''}.", "",
             f"`{s['gin_file']}`, batch {s['batch_size']} x seq {s['seq_length']}, "
             f"{s['max_predictions']} masked positions + NSP, {s['steps']:,} steps, seed "
             f"{s['seed']}, loss every {s['interval']} steps (the mean over those steps); "
             f"{s['segments']} alternating segments per run.", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for step in table_steps(sorted(curves[BASE]), s["steps"]):
        a, b = curves[BASE].get(step), curves[OTHER].get(step)
        cells = [str(step)] + [_fmt(curves[n].get(step)) for n in names]
        cells.append(_fmt(b / a - 1.0, "+.2%") if a and b is not None else "-")
        lines.append("| " + " | ".join(cells) + " |")
    t = c["step_time_s"]
    lines += ["", f"Mean {TAG} over the last {c['window']} steps: float32 "
              f"{_fmt(c['float32_window_mean'])}, bfloat16 {_fmt(c['bfloat16_window_mean'])}. "
              f"**{c['verdict']}.** Largest single-point gap after warmup: "
              f"{_fmt(c['max_pointwise_gap'], '.2%')}."]
    ref = c.get("reference")
    if ref:
        lines.append(f"Seed-to-seed scale: float32 with seed {ref['seed']} is "
                     f"{_fmt(ref['relative_gap'], '+.2%')} of seed {s['seed']} over the same "
                     "window.")
    lines += ["", f"Step time (median of the summary intervals, first of each segment left "
              f"out): float32 **{_fmt(t.get(BASE), '.3f')} s**, bfloat16 "
              f"**{_fmt(t.get(OTHER), '.3f')} s**: **{_fmt(c['speedup'], '.2f')}x**."]
    return "\n".join(lines) + "\n"


def plot(results: dict, output: str) -> str:
    """Loss curves (left) and bfloat16's relative gap to float32 (right), as a PNG."""
    from bert_trainer.demo.plotting import Curve, Panel, plot_panels  # noqa: PLC0415

    c = results["comparison"]
    curves = []
    for name in results["runs"]:
        steps, values = _curve(results, name)
        curves.append(Curve(name, tuple(steps), tuple(values), "--" if "seed" in name else "-"))
    s32, v32 = _curve(results, BASE)
    by_step = dict(zip(s32, v32, strict=True))
    gap_steps, gaps = [], []
    for step, value in zip(*_curve(results, OTHER), strict=True):
        if by_step.get(step):
            gap_steps.append(step)
            gaps.append(100.0 * (value / by_step[step] - 1.0))
    tol = 100.0 * c["tolerance"]
    panels = (Panel("masked-LM loss (mean of each interval)", tuple(curves), TAG),
              Panel("bfloat16 vs float32", (Curve("bf16 / fp32 - 1", tuple(gap_steps),
                                                  tuple(gaps), "-"),),
                    "relative gap (%)", references=((f"+{tol:.0f} %", tol),
                                                    (f"-{tol:.0f} %", -tol))))
    speed = f", {c['speedup']:.2f}x per step" if c.get("speedup") else ""
    return plot_panels(panels, output, title=f"bfloat16 vs float32 pretraining: "
                       f"{c['verdict'].split(':')[0]}{speed} "
                       f"({results['machine']['isa']['bf16_matmul']})")
