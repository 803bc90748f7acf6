"""The evaluation loop: the task's eval split through the model, distributed like training.

Each replica runs the model without dropout, updates the per-example loss means and the
task's streaming metrics, and returns the task's per-example `eval_step_outputs`; those are
gathered to the host, where the task's `aggregate_eval` turns them into metrics that need the
whole split (F1 over spans, Matthews correlation, ...).
"""

import keras
import numpy as np
import tensorflow as tf

from bert_trainer import ops
from bert_trainer.tasks.base import Task
from bert_trainer.training.train_step import checked_losses, metric_results


class Evaluator:
    """Evaluates a task's model on its eval split.

    Build it inside the strategy's scope (its metrics hold variables).

    Args:
      task: the task (inputs, losses, metrics, eval outputs).
      model: the task's model.
      strategy: the `tf.distribute` strategy the model was built under.
      fused_kernels: the fused-kernel setting to trace the step under (the training step's).
    """

    def __init__(self, task: Task, model: keras.Model, strategy, *, fused_kernels):
        self.task, self.model, self.strategy = task, model, strategy
        self.fused_kernels = fused_kernels
        self.metrics = list(task.build_metrics(training=False))
        self.loss_means = {n: keras.metrics.Mean(name=n) for n in task.loss_names}
        self._step, self._step_spec = None, None

    def _step_body(self, batch):
        outputs = self.strategy.run(self._replica, args=(batch,))
        return {k: self.strategy.gather(v, axis=0) for k, v in outputs.items()}

    def _replica(self, features):
        outputs = self.model(self.task.model_inputs(features), training=False)
        losses = checked_losses(self.task, self.task.build_losses(features, outputs))
        for n, per_example in losses.items():
            self.loss_means[n].update_state(per_example)
        self.task.update_metrics(self.metrics, features, outputs)
        return dict(self.task.eval_step_outputs(features, outputs))

    def run(self, steps: int | None) -> dict[str, float]:
        """Evaluates the current weights.

        Args:
          steps: at most this many batches; None or 0: the whole split.

        Returns:
          {name: value}: the mean per-example losses, the streaming metrics and the task's
          host-side `aggregate_eval` metrics.
        """
        for metric in [*self.loss_means.values(), *self.metrics]:
            metric.reset_state()
        dataset = self.strategy.distribute_datasets_from_function(
            lambda ctx: self.task.build_inputs(self.task.eval_split, ctx, is_training=False))
        if self._step is None or dataset.element_spec != self._step_spec:
            # Traced once, for every batch the split holds (its spec leaves the batch size
            # and the bucketed lengths open), instead of once per new shape until the
            # shapes are relaxed: 2-4 traces of the whole model per evaluation.
            self._step_spec = dataset.element_spec
            self._step = tf.function(self._step_body, input_signature=[self._step_spec],
                                     autograph=False)
        gathered: dict[str, list[np.ndarray]] = {}
        limit = steps or None
        for i, batch in enumerate(dataset):
            if limit is not None and i >= limit:
                break
            with ops.fused_kernels(self.fused_kernels):  # as the training step's
                step_outputs = self._step(batch)
            for name, value in step_outputs.items():
                gathered.setdefault(name, []).append(value.numpy())
        results = {n: float(m.result()) for n, m in self.loss_means.items()}
        results.update(metric_results(self.metrics))
        arrays = {name: np.concatenate(parts) for name, parts in gathered.items()}
        results.update({k: float(v) for k, v in self.task.aggregate_eval(arrays).items()})
        return results
