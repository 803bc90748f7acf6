"""Loss curves as a PNG, read straight from TensorBoard event files.

`read_scalars` parses `events.out.tfevents.*` files with TensorBoard's protobuf classes and a
few lines of TFRecord framing, so it needs neither TensorFlow (seconds of import) nor a
TensorBoard server. `plot_panels` draws side-by-side panels with matplotlib, which is imported
only when a plot is drawn (it is in the `dev` extra) and used through its object API on the
Agg canvas: no pyplot global state, no display needed.

  runs = {"train": read_scalars("runs/demo/pretrain/train"), ...}
  plot_panels([Panel("Pretraining", [Curve("train MLM loss", *runs["train"]["mlm_loss"])])],
              "runs/demo/loss_curves.png")
"""

import dataclasses
import glob
import math
import os
import re
import struct

import numpy as np

from bert_trainer.errors import UserError

EVENT_GLOB = "events.out.tfevents.*"


def _write_order(path: str) -> tuple:
    """An event file's place in time: its name is `events.out.tfevents.SECONDS.HOST.PID.N.v2`
    (N counts the process's writers), so two files of one second sort by N as a number, not
    as text ("10" before "9")."""
    found = re.search(r"tfevents\.(\d+)\.(.*)\.(\d+)\.(\d+)\.v2$", os.path.basename(path))
    if not found:
        return (0, "", 0, 0, path)
    seconds, host, pid, count = found.groups()
    return (int(seconds), host, int(pid), int(count), path)
# TFRecord framing: uint64 length, uint32 CRC of the length, data, uint32 CRC of the data.
_HEADER = struct.Struct("<QI")
_FOOTER_BYTES = 4
_TENSOR_DTYPES = {1: np.float32, 2: np.float64, 3: np.int32, 9: np.int64, 19: np.float16}


@dataclasses.dataclass(frozen=True)
class Curve:
    """One line of a panel.

    Attributes:
      label: legend text.
      steps: x values (training steps).
      values: y values, as many as `steps`.
      style: matplotlib format string: "-" for a line, "o--" for sparse points such as evals.
    """

    label: str
    steps: tuple
    values: tuple
    style: str = "-"

    def __post_init__(self):
        if len(self.steps) != len(self.values):
            raise UserError(f"Curve {self.label!r}: {len(self.steps)} steps but "
                            f"{len(self.values)} values; give one value per step")


@dataclasses.dataclass(frozen=True)
class Panel:
    """One subplot: a title, its curves, and optional horizontal reference lines.

    Attributes:
      title: shown above the panel.
      curves: the `Curve`s; empty ones are skipped.
      ylabel: the y axis label.
      references: (label, y) pairs drawn as dotted horizontal lines (e.g. a baseline).
      ylim: (bottom, top) of the y axis; None: fitted to the data.
    """

    title: str
    curves: tuple
    ylabel: str = "loss"
    references: tuple = ()
    ylim: tuple | None = None


def _records(path: str):
    """The data of each TFRecord in `path`; a truncated last record (a live run) ends it."""
    with open(path, "rb") as f:
        while True:
            header = f.read(_HEADER.size)
            if len(header) < _HEADER.size:
                return
            (length, _) = _HEADER.unpack(header)
            data = f.read(length)
            if len(data) < length or len(f.read(_FOOTER_BYTES)) < _FOOTER_BYTES:
                return
            yield data


def _scalar(value) -> float | None:
    """The number in a summary value: TF2 writes a scalar tensor, TF1 a simple_value."""
    if value.HasField("simple_value"):
        return float(value.simple_value)
    if not value.HasField("tensor"):
        return None
    tensor = value.tensor
    if tensor.tensor_shape.dim:  # Not a scalar (a histogram, an image): not ours to plot.
        return None
    for field in ("float_val", "double_val", "int_val", "int64_val"):
        if getattr(tensor, field):
            return float(getattr(tensor, field)[0])
    dtype = _TENSOR_DTYPES.get(tensor.dtype)
    if dtype is not None and tensor.tensor_content:
        return float(np.frombuffer(tensor.tensor_content, dtype=dtype)[0])
    return None


def read_scalars(log_dir: str, tags=None) -> dict[str, tuple[list[int], list[float]]]:
    """Every scalar summary of the event files in one directory.

    Args:
      log_dir: a TensorBoard log directory, e.g. `model_dir/train` (not searched
        recursively: each split of a run is its own directory).
      tags: keep only these tags; None keeps every scalar tag.

    Returns:
      {tag: (steps, values)}, sorted by step. A step written twice (a resumed run) keeps
      the value written last.

    Raises:
      UserError: the directory holds no event file.
    """
    from tensorboard.compat.proto import event_pb2  # noqa: PLC0415 (protobuf only; no TF)

    paths = sorted(glob.glob(os.path.join(log_dir, EVENT_GLOB)), key=_write_order)
    if not paths:
        raise UserError(f"{log_dir} holds no TensorBoard event file ({EVENT_GLOB}); pass a "
                        "model_dir's train/ or eval/ directory")
    points: dict[str, dict[int, float]] = {}
    for path in paths:  # Names start with the creation time: a resumed run's file comes last.
        for data in _records(path):
            event = event_pb2.Event.FromString(data)
            for value in event.summary.value:
                if tags is not None and value.tag not in tags:
                    continue
                number = _scalar(value)
                if number is not None:
                    points.setdefault(value.tag, {})[int(event.step)] = number
    return {tag: (sorted(steps), [steps[s] for s in sorted(steps)])
            for tag, steps in points.items()}


def plot_panels(panels, output: str, *, title: str | None = None, dpi: int = 110) -> str:
    """Draws the panels side by side and writes a PNG.

    Args:
      panels: a sequence of `Panel`s (at least one).
      output: the PNG path (its directory is created).
      title: a title over all panels.
      dpi: resolution; the figure is 5.5 x 4.2 inches per panel.

    Returns:
      `output`.

    Raises:
      UserError: no panel, or matplotlib is not installed.
    """
    if not panels:
        raise UserError("plot_panels: give at least one Panel to draw")
    try:
        from matplotlib.figure import Figure  # noqa: PLC0415 (optional: the dev extra)
    except ImportError:
        raise UserError("plotting needs matplotlib: pip install matplotlib (or "
                        "pip install -e '.[dev]')") from None
    figure = Figure(figsize=(5.5 * len(panels), 4.2), layout="constrained")
    for axes, panel in zip(figure.subplots(1, len(panels), squeeze=False)[0], panels, strict=True):
        _draw(axes, panel)
    if title:
        figure.suptitle(title, fontsize=12)
    if os.path.dirname(output):
        os.makedirs(os.path.dirname(output), exist_ok=True)
    figure.savefig(output, dpi=dpi)  # Figure without pyplot renders on the Agg canvas.
    return output


def _draw(axes, panel: Panel) -> None:
    drawn = 0
    for curve in panel.curves:
        pairs = [(s, v) for s, v in zip(curve.steps, curve.values, strict=True) if math.isfinite(v)]
        if pairs:
            # A line through one point draws nothing: give a lone point a marker.
            style = curve.style if len(pairs) > 1 or "o" in curve.style else "o" + curve.style
            axes.plot(*zip(*pairs, strict=True), style, label=curve.label, linewidth=1.6,
                      markersize=5)
            drawn += 1
    for label, y in panel.references:
        axes.axhline(y, linestyle=":", color="gray", label=label)
    axes.set_title(panel.title, fontsize=11)
    axes.set_xlabel("step")
    axes.set_ylabel(panel.ylabel)
    if panel.ylim is not None:
        axes.set_ylim(*panel.ylim)
    axes.grid(alpha=0.3)
    if drawn or panel.references:
        axes.legend(fontsize=8)
    else:
        axes.text(0.5, 0.5, "no data", ha="center", va="center", transform=axes.transAxes)
