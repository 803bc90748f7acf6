"""Keras' AdamW with its dense update done in one fused kernel per variable."""

import keras
import tensorflow as tf

from bert_trainer import ops


@keras.saving.register_keras_serializable(package="bert_trainer")
class FusedAdamW(keras.optimizers.AdamW):
    """`keras.optimizers.AdamW` whose per-variable update is one kernel.

    Keras' TensorFlow update is eight elementwise ops per variable (each a pass over the
    variable, its moments or the gradient), plus two for the decoupled weight decay and one
    for a global-norm clip applied before it. Here:

    - where the fused CPU kernels run (`bert_trainer.ops.apply_adamw`), one kernel does the
      clip scale, the weight decay and the Adam update in one pass over the variable, its
      moments and the gradient;
    - elsewhere (GPU, TPU, kernels off), TensorFlow's fused `ResourceApplyAdam` does the Adam
      update, after Keras' weight decay.

    Both compute the same formula in the same order (var -= var * wd * lr; then
    m += (g - m)(1 - b1); v += (g^2 - v)(1 - b2); var -= lr sqrt(1 - b2^t) / (1 - b1^t) m /
    (sqrt(v) + eps)), and everything else - which variables decay, the slot variables and
    their checkpoint names, the schedule - is Keras'. TensorFlow's kernel updates in one pass
    what Keras' ops do in several (the speed-up: benchmarks/README.md).

    `apply(grads, variables, gradient_scale=s)` multiplies the gradients by the scalar `s`
    (a global-norm clip factor) inside the update instead of in a pass of its own (before
    Keras' own accumulation or clipping where those are configured).

    Sparse gradients, AMSGrad and non-TensorFlow backends take Keras' own update.
    """

    _gradient_scale = None  # set by `apply` while it traces the update

    def apply(self, grads, trainable_variables=None, gradient_scale=None):
        """Keras' `apply`, with the gradients first multiplied by the scalar `gradient_scale`.

        Args:
          grads: gradients, one per variable.
          trainable_variables: as Keras' `apply`.
          gradient_scale: None, or a float32 scalar tensor every gradient is multiplied by
            (folded into the fused update where it runs).
        """
        if gradient_scale is not None and (
                self.gradient_accumulation_steps or self.clipnorm or self.clipvalue
                or self.global_clipnorm or keras.backend.backend() != "tensorflow"):
            # Keras accumulates or clips the gradients it is given: scale them first.
            grads = [None if g is None else g * tf.cast(gradient_scale, g.dtype)
                     for g in grads]
            gradient_scale = None
        self._gradient_scale = gradient_scale
        try:
            return super().apply(grads, trainable_variables)
        finally:
            self._gradient_scale = None

    def _apply_weight_decay(self, variables):
        # On TensorFlow, decay is applied per variable in `update_step`, fused into the update
        # where it can be; Keras would apply it to every variable first, in passes of its own.
        if keras.backend.backend() != "tensorflow":
            super()._apply_weight_decay(variables)

    def update_step(self, gradient, variable, learning_rate):
        if keras.backend.backend() != "tensorflow":  # Keras' own update (and decay)
            return super().update_step(gradient, variable, learning_rate)
        scale = self._gradient_scale
        if self.amsgrad or isinstance(gradient, tf.IndexedSlices):
            if scale is not None:
                scale = tf.cast(scale, gradient.dtype)
                gradient = (tf.IndexedSlices(gradient.values * scale, gradient.indices,
                                             gradient.dense_shape)
                            if isinstance(gradient, tf.IndexedSlices) else gradient * scale)
            self._decay(variable)
            return super().update_step(gradient, variable, learning_rate)
        m, v, adam = self._adam_inputs(variable, learning_rate)
        decay = tf.cast(self.weight_decay, variable.dtype) if self._decays(variable) else None
        ops.apply_adamw(variable, m, v, gradient, weight_decay=decay, grad_scale=scale, **adam)
        return None

    def _adam_inputs(self, variable, learning_rate):
        """`variable`'s moment slots and Adam's scalars in its dtype (`ResourceApplyAdam`'s
        keyword names)."""
        dtype = variable.dtype
        step = tf.cast(self.iterations + 1, dtype)
        beta_1, beta_2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
        index = self._get_variable_index(variable)
        return self._momentums[index], self._velocities[index], dict(
            lr=tf.cast(learning_rate, dtype), beta1_power=tf.pow(beta_1, step),
            beta2_power=tf.pow(beta_2, step), beta1=beta_1, beta2=beta_2,
            epsilon=tf.cast(self.epsilon, dtype))

    def _decays(self, variable) -> bool:
        return self.weight_decay is not None and self._use_weight_decay(variable)

    def _decay(self, variable) -> None:
        """Keras' decoupled weight decay of `variable` (`_apply_weight_decay`'s formula)."""
        if self._decays(variable):
            lr = tf.cast(self.learning_rate, variable.dtype)
            wd = tf.cast(self.weight_decay, variable.dtype)
            variable.assign_sub(variable * wd * lr)
