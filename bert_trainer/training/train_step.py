"""The compiled optimizer step and the loop that runs `steps_per_loop` of them.

One optimizer step (`TrainStep._step`, cross-replica context, inside the loop's tf.function):
    1. per replica: forward + backward on a micro-batch; losses are divided by the GLOBAL batch
       (x accumulation_steps), so summing over replicas and micro-batches gives the mean. With
       accumulation_steps k > 1 this runs k times into non-trainable accumulators.
    2. per replica: all-reduce (sum) gradients and losses once; the global gradient norm.
    3. across replicas: if the loss or the norm is NaN/Inf the update is NOT applied, the step
       is recorded in `nonfinite_step` and the loop stops. (float16 loss-scale overflows are the
       LossScaleOptimizer's business: it skips them and lowers the scale.) Otherwise: clip by
       the global norm, apply, global_step += 1.
No value leaves the device inside the loop.
"""

import keras
import tensorflow as tf
from absl import logging

from bert_trainer import features as F
from bert_trainer import ops
from bert_trainer.tasks.base import Task
from bert_trainer.training import optimization, throughput
from bert_trainer.training.fused_adamw import FusedAdamW


def checked_losses(task: Task, losses: dict) -> dict:
    """`losses` from `task.build_losses` as float32, after checking the declared names."""
    if set(losses) != set(task.loss_names):
        raise ValueError(f"task {task.name!r}: build_losses returned {sorted(losses)} but "
                         f"loss_names declares {sorted(task.loss_names)}")
    return {n: tf.cast(v, tf.float32) for n, v in losses.items()}


class TrainStep:
    """The training step of one run: its state, its metrics and its compiled loop.

    Build it under `strategy.scope()`: it creates the step counters, the training metrics and
    the gradient accumulators there.

    Args:
        task: the task (losses, metrics, model inputs).
        model: the task's model.
        optimizer: from `optimization.build_optimizer` (applies gradients as given).
        strategy: the run's strategy.
        accumulation_steps: micro-batches per optimizer step.
        global_batch: examples per optimizer step over all replicas, the losses' divisor
            (None: the task's training batch x accumulation_steps).
        clip_norm: clip to this global gradient norm (None: no clipping).
        jit_compile: compile the forward/backward pass with XLA.
        stop_flag: a scalar bool variable read before every step; when True the loop ends
            there (set from another thread on a stop signal, see `preemption.StopSignals`).
            None: never checked.

    Attributes:
        global_step: int64 variable, optimizer steps applied (checkpointed).
        nonfinite_step: int64 variable, the step refused for NaN/Inf, -1 while all is well.
        loss_means: {loss name: Mean} over the steps since the last `reset_metrics`.
        metrics: the task's training metrics.
        counts_flops: whether `counts()` reports model FLOPs (the task can count them:
            `Task.flops_counter`).
        fused_kernels: the fused CPU kernels' setting its loop is traced under
            (`bert_trainer.ops.fused_kernels`): the one in force when it was built.
    """

    def __init__(self, task: Task, model: keras.Model, optimizer, strategy, *,
                 accumulation_steps: int = 1, global_batch: int | None = None,
                 clip_norm: float | None = None, jit_compile: bool = False,
                 stop_flag: tf.Variable | None = None):
        self.task = task
        self.model = model
        self.optimizer = optimizer
        self.strategy = strategy
        self.accumulation_steps = accumulation_steps
        self.global_batch = global_batch or task.global_batch_size(True) * accumulation_steps
        self.clip_norm = clip_norm
        self.jit_compile = jit_compile
        self.stop_flag = stop_flag
        self.fused_kernels = ops.mode()
        first_replica = tf.VariableAggregation.ONLY_FIRST_REPLICA
        self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step",
                                       aggregation=first_replica)
        self.nonfinite_step = tf.Variable(-1, dtype=tf.int64, trainable=False,
                                          name="nonfinite_step", aggregation=first_replica)
        self.metrics = list(task.build_metrics(training=True))
        self.loss_means = {n: keras.metrics.Mean(name=n) for n in task.loss_names}
        self._grad_norm = keras.metrics.Mean(name="grad_norm")
        self._examples = keras.metrics.Sum(name="examples")
        self._tokens = keras.metrics.Sum(name="tokens")
        self._token_slots = keras.metrics.Sum(name="token_slots")  # padding included
        self._flops = keras.metrics.Sum(name="model_flops")
        self._count_flops = task.flops_counter(model)
        self.counts_flops = self._count_flops is not None
        if accumulation_steps > 1:
            self._build_accumulators()
        self._loss_scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
        self._grad_indices = None  # trainable variables that get a gradient (set when traced)
        self._counts_tokens = False  # whether batches have an input mask (set when traced)
        self._forward = (tf.function(self._forward_backward, jit_compile=True)
                         if jit_compile else self._forward_backward)
        # Graph control flow is written out (tf.while_loop, tf.cond): AutoGraph need not convert
        # the loop, nor anything it calls (see bert_trainer/autograph_rules.py).
        self._loop = tf.function(self._loop_body, autograph=False)

    def _build_accumulators(self) -> None:
        # ON_READ: each replica accumulates its own partial gradient; they are summed by the
        # explicit all-reduce of the step, never implicitly.
        def local(value, name):
            return tf.Variable(value, trainable=False, name=name,
                               synchronization=tf.VariableSynchronization.ON_READ,
                               aggregation=tf.VariableAggregation.SUM)

        self._grad_accumulators = [local(tf.zeros(v.shape, v.dtype), "grad_accumulator")
                                   for v in self.model.trainable_variables]
        self._loss_accumulators = {n: local(0.0, f"{n}_accumulator") for n in self.task.loss_names}

    # ---------------------------------------------------------------- host-side interface

    def run(self, iterator, num_steps: int) -> int:
        """Runs up to `num_steps` steps in one compiled call.

        Returns:
            The step refused for a NaN/Inf loss or gradient norm, or -1 (the loop stops there).
        """
        with ops.fused_kernels(self.fused_kernels):  # where the loop is (re)traced
            self._loop(iterator, tf.constant(num_steps, tf.int32))
        return int(self.nonfinite_step.numpy())

    def tracing_count(self) -> int:
        """How often the loop's tf.functions (the loop, and the forward pass where it is a
        function of its own) have been traced: a new input shape that retraces shows here."""
        functions = [self._loop, self._forward]
        return sum(f.experimental_get_tracing_count() for f in functions
                   if hasattr(f, "experimental_get_tracing_count"))

    def clear_nonfinite(self) -> None:
        """Forgets a refused step (after a rollback), so that the loop can run again."""
        self.nonfinite_step.assign(-1)

    def results(self) -> dict[str, float]:
        """Mean losses, task metrics and mean gradient norm since the last reset."""
        values = {n: float(m.result()) for n, m in self.loss_means.items()}
        values.update(metric_results(self.metrics))
        values["grad_norm"] = float(self._grad_norm.result())
        return values

    def counts(self) -> throughput.Counts:
        """Examples, tokens, token slots and model FLOPs since the last reset."""
        tokens = slots = flops = None
        if self._counts_tokens:
            tokens, slots = float(self._tokens.result()), float(self._token_slots.result())
        if self.counts_flops:
            flops = float(self._flops.result())
        return throughput.Counts(float(self._examples.result()), tokens, slots, flops)

    def reset_metrics(self) -> None:
        for metric in [*self.loss_means.values(), *self.metrics, self._grad_norm,
                       self._examples, self._tokens, self._token_slots, self._flops]:
            metric.reset_state()

    # ---------------------------------------------------------- per replica (replica context)

    def _forward_backward(self, features):
        """Gradients and losses of one replica's micro-batch, scaled to the global batch."""
        batch = self.global_batch
        with tf.GradientTape() as tape:
            outputs = self.model(self.task.model_inputs(features), training=True)
            per_example = checked_losses(self.task, self.task.build_losses(features, outputs))
            losses = {n: tf.nn.compute_average_loss(v, global_batch_size=batch)
                      for n, v in per_example.items()}
            objective = losses["loss"]
            if self.model.losses:  # layer regularizers, counted once over all replicas
                objective += tf.nn.scale_regularization_loss(
                    tf.add_n(self.model.losses)) / self.accumulation_steps
            if self._loss_scaled:
                objective = self.optimizer.scale_loss(objective)
        grads = tape.gradient(objective, self.model.trainable_variables)
        self.task.update_metrics(self.metrics, features, outputs)
        self._count_batch(features, outputs)
        return self._dense_gradients(grads), losses

    def _dense_gradients(self, grads) -> list:
        # Runs at trace time: which variables get a gradient is a property of the graph.
        if self._grad_indices is None:
            self._grad_indices = [i for i, g in enumerate(grads) if g is not None]
            unused = [v.path for v, g in zip(self.model.trainable_variables, grads, strict=True)
                      if g is None]
            if unused:
                logging.warning("No gradient reaches %d variable(s), left untrained: %s",
                                len(unused), ", ".join(unused))
        # Embedding gradients come as IndexedSlices; dense tensors all-reduce and accumulate
        # uniformly.
        return [tf.convert_to_tensor(grads[i]) for i in self._grad_indices]

    def _count_batch(self, features, outputs) -> None:
        first = features[sorted(features)[0]]
        self._examples.update_state(tf.cast(tf.shape(first)[0], tf.float32))
        if F.INPUT_MASK in features:
            self._counts_tokens = True  # set at trace time
            mask = tf.cast(features[F.INPUT_MASK] != 0, tf.float32)
            self._tokens.update_state(tf.reduce_sum(mask))
            self._token_slots.update_state(tf.cast(tf.size(mask), tf.float32))
        if self.counts_flops:  # here, in the forward pass's trace: what the model skipped
            self._flops.update_state(self._count_flops(features, outputs))

    def _accumulate(self, features) -> None:
        grads, losses = self._forward(features)
        for i, g in zip(self._grad_indices, grads, strict=True):
            self._grad_accumulators[i].assign_add(g)
        for n, value in losses.items():
            self._loss_accumulators[n].assign_add(value)

    def _take_accumulated(self):
        grads = [self._grad_accumulators[i].read_value() for i in self._grad_indices]
        losses = {n: a.read_value() for n, a in self._loss_accumulators.items()}
        # Automatic control dependencies order these resets after the reads above.
        for a in [*self._grad_accumulators, *self._loss_accumulators.values()]:
            a.assign(tf.zeros_like(a))
        return grads, losses

    def _all_reduce(self, grads, losses):
        """Sums gradients and losses over replicas; returns them with the global norm."""
        ctx = tf.distribute.get_replica_context()
        grads, losses = ctx.all_reduce(tf.distribute.ReduceOp.SUM, (grads, losses))
        unscaled = grads
        if self._loss_scaled:
            unscaled = [g / self.optimizer.dynamic_scale for g in grads]
        norm = optimization.global_norm(unscaled)
        # Every replica adds the same global values: the means' ratios are unaffected.
        for n, value in losses.items():
            self.loss_means[n].update_state(value)
        finite = tf.math.is_finite(norm)
        self._grad_norm.update_state(tf.where(finite, norm, 0.0), tf.cast(finite, tf.float32))
        return grads, norm, losses["loss"]

    def _apply(self, grads, norm) -> None:
        variables = [self.model.trainable_variables[i] for i in self._grad_indices]
        if self.clip_norm is not None and isinstance(self.optimizer, FusedAdamW):
            # The clip factor is applied inside the optimizer's one-pass update.
            factor = optimization.clip_factor(norm, self.clip_norm)
            self.optimizer.apply(grads, variables, gradient_scale=factor)
            return
        grads = optimization.clip_by_global_norm(grads, norm, self.clip_norm)
        self.optimizer.apply(grads, variables)

    # ------------------------------------------------------ one step (cross-replica context)

    def _step(self, iterator):
        """One optimizer step. Returns False when it was refused (NaN/Inf)."""
        run = self.strategy.run
        if self.accumulation_steps == 1:
            grads, losses = run(self._forward, args=(next(iterator),))
        else:
            def accumulate(i):
                run(self._accumulate, args=(next(iterator),))
                return i + 1

            tf.while_loop(lambda i: i < self.accumulation_steps, accumulate, [tf.constant(0)])
            grads, losses = run(self._take_accumulated)
        grads, norm, loss = run(self._all_reduce, args=(grads, losses))
        # All replicas hold the same reduced values; any one decides for all.
        norm = self.strategy.experimental_local_results(norm)[0]
        loss = self.strategy.experimental_local_results(loss)[0]
        ok = tf.math.is_finite(loss)
        if not self._loss_scaled:  # float16 overflows are skipped by the LossScaleOptimizer
            ok = tf.logical_and(ok, tf.math.is_finite(norm))

        def apply():
            run(self._apply, args=(grads, norm))
            self.global_step.assign_add(1)

        def refuse():
            self.nonfinite_step.assign(self.global_step + 1)

        # The cond is taken in cross-replica context: optimizer updates synchronise replicas,
        # which tf.distribute does not allow inside a replica-context cond.
        tf.cond(ok, apply, refuse)
        return ok

    def _loop_body(self, iterator, num_steps):
        """Up to `num_steps` steps; stops after a refused step, or before a step once
        `stop_flag` is set (a stop request ends a long loop at a step boundary)."""
        def more(i, ok):
            go = tf.logical_and(i < num_steps, ok)
            if self.stop_flag is not None:
                go = tf.logical_and(go, tf.logical_not(self.stop_flag.read_value()))
            return go

        def step(i, ok):
            del ok
            return i + 1, self._step(iterator)

        tf.while_loop(more, step, [tf.constant(0), tf.constant(True)])


def metric_results(metrics) -> dict[str, float]:
    """Scalar results of Keras metrics; a metric returning a dict contributes each entry."""
    out = {}
    for metric in metrics:
        result = metric.result()
        items = result.items() if isinstance(result, dict) else [(metric.name, result)]
        for name, value in items:
            value = keras.ops.convert_to_numpy(value)
            if value.size != 1:
                raise ValueError(f"metric {name!r} is not a scalar (shape {value.shape}); "
                                 "return per-class values from aggregate_eval instead")
            out[name] = float(value.reshape(()))
    return out
