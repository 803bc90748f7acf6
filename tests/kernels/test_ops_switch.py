"""bert_trainer.ops' one switch: a scope decides between the fused CPU kernels and
TensorFlow's ops, `BERT_TRAIN_FUSED_KERNELS` is only its default, the trainer traces under
the setting it was built with and the exporter under `portable()` (TensorFlow's ops, no
packing)."""

import threading

import pytest
import tensorflow as tf
from conftest import require_fused_kernels
from toy_task import ToyConfig, ToyTask

from bert_trainer import ops, serving
from bert_trainer.layers import Dropout
from bert_trainer.training.optimization import OptimizerConfig
from bert_trainer.training.trainer import Trainer, TrainerConfig


def _graph_op_types(graph_def) -> set:
    """Op types of a GraphDef's nodes and of every function in its library."""
    types = {node.op for node in graph_def.node}
    for function in graph_def.library.function:
        types |= {node.op for node in function.node_def}
    return types


def _dropout_op_types(fn=None) -> set:
    """Op types of a training-mode dropout traced now (through `fn`, a wrapper, if given)."""
    layer = Dropout(0.5, seed=1)
    step = (lambda x: layer(x, training=True)) if fn is None else fn(
        lambda x: layer(x, training=True))
    concrete = tf.function(step).get_concrete_function(tf.TensorSpec([4, 8], tf.float32))
    return _graph_op_types(concrete.graph.as_graph_def())


def test_the_variable_is_only_the_default_and_a_scope_wins(monkeypatch):
    require_fused_kernels(monkeypatch)  # the kernels can run here
    monkeypatch.setenv(ops.MODE_ENV, "off")
    assert ops.mode() == "off" and not ops.fused()
    assert "BertFusedDropout" not in _dropout_op_types()
    with ops.fused_kernels(True):
        assert ops.mode() == "on" and ops.fused()
        assert "BertFusedDropout" in _dropout_op_types()
        with ops.fused_kernels(False):  # the innermost scope decides
            assert "BertFusedDropout" not in _dropout_op_types()
        assert ops.fused()
    monkeypatch.setenv(ops.MODE_ENV, "on")
    assert "BertFusedDropout" in _dropout_op_types()
    with ops.fused_kernels(False):
        types = _dropout_op_types()
        assert "BertFusedDropout" not in types and "StatelessRandomUniformFullIntV2" in types
    with ops.fused_kernels("auto"):
        assert ops.mode() == "auto" and ops.fused()


def test_a_scope_of_none_pins_the_setting_in_force_where_it_opens(monkeypatch):
    monkeypatch.setenv(ops.MODE_ENV, "off")
    with ops.fused_kernels() as setting:
        monkeypatch.setenv(ops.MODE_ENV, "on")
        assert setting == "off" and ops.mode() == "off"
    assert ops.mode() == "on"
    with pytest.raises(ValueError, match=r"fused_kernels\('fast'\): expected True, False"):
        with ops.fused_kernels("fast"):
            pass


def test_a_thread_without_a_scope_takes_the_one_open_elsewhere(monkeypatch):
    """A MirroredStrategy traces each replica's step in a thread of its own."""
    monkeypatch.setenv(ops.MODE_ENV, "auto")
    seen = []

    def look():
        seen.append(ops.mode())

    with ops.fused_kernels(False):
        thread = threading.Thread(target=look)
        thread.start()
        thread.join()
    look()
    assert seen == ["off", "auto"]


def test_the_exporters_functions_are_traced_with_tensorflow_ops(monkeypatch):
    require_fused_kernels(monkeypatch)  # on: the kernels would run anywhere else
    assert "BertFusedDropout" in _dropout_op_types()
    assert "BertFusedDropout" not in _dropout_op_types(serving._tensorflow_ops_only)


def _trainer(model_dir):
    return Trainer(ToyTask(ToyConfig()), str(model_dir),
                   config=TrainerConfig(train_steps=2, steps_per_loop=1, eval_steps=0),
                   optimizer=OptimizerConfig(learning_rate=1e-2, warmup_steps=1,
                                             decay_steps=4))


def _trained_step_op_types(trainer) -> set:
    iterator = trainer.train_iterator()
    trainer.run_steps(iterator, 1)  # traced here, outside any scope
    loop = trainer._step._loop
    concrete = loop.get_concrete_function(iterator, tf.constant(1, tf.int32))
    assert loop.experimental_get_tracing_count() == 1  # the trace run_steps made
    return _graph_op_types(concrete.graph.as_graph_def())


def test_the_trainer_traces_its_step_under_the_setting_it_was_built_with(monkeypatch,
                                                                         tmp_path):
    require_fused_kernels(monkeypatch)
    monkeypatch.setenv(ops.MODE_ENV, "off")
    with ops.fused_kernels(True):
        trainer = _trainer(tmp_path / "on")
    assert trainer._step.fused_kernels == "on"
    assert "BertApplyAdamW" in _trained_step_op_types(trainer)  # the optimizer's kernel
    monkeypatch.setenv(ops.MODE_ENV, "on")
    with ops.fused_kernels(False):
        trainer = _trainer(tmp_path / "off")
    types = _trained_step_op_types(trainer)
    assert "ResourceApplyAdam" in types and not {t for t in types if t.startswith("Bert")}
