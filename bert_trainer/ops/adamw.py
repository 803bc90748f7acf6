"""One dense AdamW update: the fused kernel or TensorFlow's `ResourceApplyAdam` (`switch`)."""

import tensorflow as tf

from bert_trainer.ops.switch import fused


def apply_adamw(variable, m, v, grad, *, lr, beta1_power, beta2_power, beta1, beta2, epsilon,
                weight_decay=None, grad_scale=None):
    """`g = grad * grad_scale`; `variable -= variable * weight_decay * lr` (Keras' decoupled
    decay); then `ResourceApplyAdam`'s update of `variable`, `m`, `v` with `g`.

    A float32 variable is updated by one kernel in one pass; any other, or where the kernels
    do not run, by the scale, the decay and TensorFlow's `ResourceApplyAdam`: the same
    formula in the same order.

    Args:
      variable, m, v: the variable and its moment slots (resource variables, one dtype).
      grad: its dense gradient.
      lr, beta1_power, beta2_power, beta1, beta2, epsilon: scalars in the variable's dtype.
      weight_decay: scalar in the variable's dtype, or None (no decay).
      grad_scale: scalar the gradient is multiplied by (a clip factor), or None.
    """
    dtype = variable.dtype
    if dtype == tf.float32 and fused():
        from bert_trainer import kernels  # noqa: PLC0415

        f32 = tf.float32
        return kernels.apply_adamw(
            variable, m, v, tf.cast(grad, f32), lr=lr, beta1_power=beta1_power,
            beta2_power=beta2_power, beta1=beta1, beta2=beta2, epsilon=epsilon,
            weight_decay=tf.cast(0.0 if weight_decay is None else weight_decay, f32),
            grad_scale=tf.cast(1.0 if grad_scale is None else grad_scale, f32))
    if grad_scale is not None:
        grad = grad * tf.cast(grad_scale, grad.dtype)
    if weight_decay is not None:
        variable.assign_sub(variable * weight_decay * lr)
    return tf.raw_ops.ResourceApplyAdam(
        var=variable.handle, m=m.handle, v=v.handle, grad=tf.cast(grad, dtype), lr=lr,
        beta1_power=beta1_power, beta2_power=beta2_power, beta1=beta1, beta2=beta2,
        epsilon=epsilon)
