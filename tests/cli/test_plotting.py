"""Reading scalars back from TensorBoard event files, and drawing the loss-curve PNG."""

import glob
import os
import struct
import sys

import numpy as np
import pytest
import tensorflow as tf

from bert_trainer.demo import plotting
from bert_trainer.errors import UserError


def _write(log_dir, values_by_step, histogram=False):
    writer = tf.summary.create_file_writer(str(log_dir))
    with writer.as_default():
        for step, values in values_by_step.items():
            for tag, value in values.items():
                tf.summary.scalar(tag, value, step=step)
            if histogram:
                tf.summary.histogram("weights", np.arange(4.0), step=step)
    writer.close()


def test_read_scalars_returns_the_written_values_in_step_order(tmp_path):
    _write(tmp_path, {10: {"loss": 2.5, "mlm_loss": 2.0}, 20: {"loss": 1.25}, 5: {"loss": 3.0}},
           histogram=True)
    scalars = plotting.read_scalars(str(tmp_path))
    assert scalars["loss"] == ([5, 10, 20], [3.0, 2.5, 1.25])
    assert scalars["mlm_loss"] == ([10], [2.0])
    assert "weights" not in scalars  # a histogram is not a scalar
    assert set(plotting.read_scalars(str(tmp_path), tags={"mlm_loss"})) == {"mlm_loss"}


def test_a_resumed_run_overrides_repeated_steps_and_a_truncated_record_ends_the_file(tmp_path):
    _write(tmp_path, {10: {"loss": 2.0}, 20: {"loss": 1.5}})
    first = glob.glob(str(tmp_path / "events.out.tfevents.*"))[0]
    # A second file sorts after the first (names start with the time): a resumed run.
    _write(tmp_path, {20: {"loss": 1.0}, 30: {"loss": 0.5}})
    with open(first, "ab") as f:  # A live writer's half-written record.
        f.write(struct.pack("<QI", 100, 0) + b"\x00" * 10)
    assert plotting.read_scalars(str(tmp_path))["loss"] == ([10, 20, 30], [2.0, 1.0, 0.5])


def test_read_scalars_needs_no_tensorflow_import(tmp_path):
    _write(tmp_path, {1: {"loss": 1.0}})
    code = ("import sys; from bert_trainer.demo import plotting; "
            f"assert plotting.read_scalars({str(tmp_path)!r})['loss'] == ([1], [1.0]); "
            "assert 'tensorflow' not in sys.modules, 'TensorFlow was imported'")
    assert os.system(f'"{sys.executable}" -c "{code}"') == 0


def test_a_directory_without_events_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="holds no TensorBoard event file"):
        plotting.read_scalars(str(tmp_path))


def test_curve_lengths_must_match():
    with pytest.raises(UserError, match="2 steps but 1 values"):
        plotting.Curve("loss", (1, 2), (0.5,))


def test_plot_panels_writes_a_png_sized_by_the_panel_count(tmp_path):
    panels = [plotting.Panel("a", (plotting.Curve("loss", (1, 2, 3), (3.0, float("nan"), 1.0)),
                                   plotting.Curve("eval", (3,), (1.5,), style="o--"))),
              plotting.Panel("b", (), ylabel="accuracy", references=(("baseline", 0.4),)),
              plotting.Panel("c", ())]
    out = plotting.plot_panels(panels, str(tmp_path / "sub" / "curves.png"), title="t", dpi=50)
    with open(out, "rb") as f:
        header = f.read(24)
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", header[16:24])
    assert (width, height) == (round(5.5 * 3 * 50), round(4.2 * 50))
    with pytest.raises(UserError, match="at least one Panel"):
        plotting.plot_panels([], str(tmp_path / "x.png"))


def test_event_files_of_one_second_sort_by_their_writer_count_as_a_number():
    """A process's 10th writer sorts after its 9th (as text, "10" < "9")."""
    names = [f"/d/events.out.tfevents.1795771162.host.a.b.123.{n}.v2" for n in (10, 9)]
    earlier = "/d/events.out.tfevents.1795771161.host.a.b.123.11.v2"
    assert sorted([*names, earlier], key=plotting._write_order) == [earlier, *names[::-1]]
