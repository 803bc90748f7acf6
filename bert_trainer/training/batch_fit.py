"""Automatic batch fitting: the largest per-replica micro-batch that fits memory, and the
gradient accumulation that brings it back to the global batch the recipe asks for.

    batch 256 = 4 steps x 64 per replica x 1 replica

The task's training batch stays the global batch of one optimizer step (times
`TrainerConfig.accumulation_steps`, usually 1; the learning-rate schedule, per optimizer step,
is unchanged). Each replica's batch of `P = task batch / replicas` rows is split into `P / m`
micro-batches of `m` rows (`m` divides `P`), run one after the other into the gradient
accumulators. The examples of an optimizer step are exactly those of the
unsplit batch, so the update equals the full-batch update up to float summation order, and a
resumed run (which skips whole batches) stays exact whatever micro-batch it uses.

How `m` is found (`plan_batch`):
1. A plan cached in `model_dir/batch_plan.json` for the same batch, accumulation, replicas,
   sequence length and precision is reused: a resume neither probes again nor changes the
   micro-batch.
2. `micro_batch_size` forces `m` (it must divide `P`).
3. Otherwise candidates are `P`, then halving, each a divisor of `P` (96: 96, 48, 24, 12, ...).
   - CPU: an out-of-memory kills the process instead of raising, so the probe must never run
     a size that could not fit. The budget is `MEMORY_FRACTION` of the memory available now
     (MemAvailable in /proc/meminfo, bounded by a cgroup v2 `memory.max`; os.sysconf's
     available pages where /proc is absent) on top of the process's current RSS. A cheap
     estimate (`estimate_step_bytes`: gradients plus activation bytes per example x m) decides
     first: `estimate * SAFETY <= budget` fits without a probe (the common case: seconds are
     not spent), `estimate > budget` is skipped unprobed; only sizes in between are probed, by
     one forward+backward of the real model whose peak RSS (VmHWM, reset through
     /proc/self/clear_refs) must stay within the budget.
   - GPU/TPU: TensorFlow does not report a device's total memory, and an out-of-memory raises
     `tf.errors.ResourceExhaustedError`, so each candidate is probed from `P` down until one
     runs; the peak of `tf.config.experimental.get_memory_info` is logged and cached.
"""

import dataclasses
import json
import os
import re

import tensorflow as tf
from absl import logging

from bert_trainer import features as F
from bert_trainer.checkpoints import storage
from bert_trainer.errors import UserError
from bert_trainer.training import memory

PLAN_FILE = "batch_plan.json"
# Of the memory available when the run starts, the share a CPU training step may take: the
# rest is left to the input pipeline, evaluation and other processes.
MEMORY_FRACTION = 0.7
# Below budget / SAFETY a size fits without a probe. Measured on CPU, float32, MiniLM's sizes
# (6 layers x 384, 12 heads) at sequence 128: the peak RSS a step added was 0.68, 0.86 and
# 0.95 of `estimate_step_bytes` at batches 8, 16 and 32 (its per-example slope 1.07 of the
# estimate's): a factor of 2 leaves room for other encoders and TensorFlow versions.
SAFETY = 2.0
_OUT_OF_MEMORY = re.compile(r"out of memory|\bOOM\b|failed to allocate", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    """How one optimizer step's global batch is computed.

    Attributes:
        global_batch: examples per optimizer step, summed over replicas.
        micro_batch: examples per replica per forward/backward pass.
        accumulation_steps: micro-batches per optimizer step.
        replicas: replicas in sync.
        how: "forced", "estimate", "probe" or "cached" (how `micro_batch` was decided).
        peak_bytes: the probe's measured peak at `micro_batch` (None when not probed).
    """

    global_batch: int
    micro_batch: int
    accumulation_steps: int
    replicas: int
    how: str = "estimate"
    peak_bytes: int | None = None

    def __post_init__(self):
        if self.micro_batch * self.accumulation_steps * self.replicas != self.global_batch:
            raise ValueError(f"{self} does not multiply to its global batch")

    def __str__(self) -> str:
        steps = "step" if self.accumulation_steps == 1 else "steps"
        replicas = "replica" if self.replicas == 1 else "replicas"
        return (f"batch {self.global_batch} = {self.accumulation_steps} {steps} x "
                f"{self.micro_batch} per replica x {self.replicas} {replicas}")


def make_plan(task_batch: int, replicas: int, micro_batch: int, *, accumulation_steps: int = 1,
              how: str = "forced", peak_bytes: int | None = None) -> BatchPlan:
    """The plan that runs each task batch of `task_batch` examples (over all replicas) in
    micro-batches of `micro_batch` per replica, `accumulation_steps` task batches per
    optimizer step (`TrainerConfig.accumulation_steps`, usually 1).

    Raises:
        UserError: the task batch does not divide among the replicas, or `micro_batch` does
            not divide the per-replica batch.
    """
    per_replica = per_replica_batch(task_batch, replicas)
    if micro_batch < 1 or per_replica % micro_batch:
        raise UserError(f"micro_batch_size={micro_batch} must divide the per-replica batch "
                        f"{per_replica} (batch {task_batch} over {replicas} replica(s)); "
                        f"choose one of {', '.join(map(str, divisors(per_replica)))}")
    return BatchPlan(task_batch * accumulation_steps, micro_batch,
                     accumulation_steps * per_replica // micro_batch, replicas, how, peak_bytes)


def per_replica_batch(batch: int, replicas: int) -> int:
    """`batch` over `replicas` (UserError when it does not divide)."""
    if batch % replicas:
        raise UserError(f"the global batch {batch} does not divide among {replicas} "
                        "replicas; choose a multiple of the replica count")
    return batch // replicas


def divisors(n: int) -> list[int]:
    """The divisors of `n`, largest first."""
    return [d for d in range(n, 0, -1) if n % d == 0]


def candidates(per_replica: int) -> list[int]:
    """Micro-batch sizes to try, largest first: `per_replica`, then each time the largest
    divisor of `per_replica` no larger than half the previous size (96: 96, 48, 24, 12, 6, 3,
    1; 100: 100, 50, 25, 10, 5, 2, 1)."""
    sizes = [per_replica]
    while sizes[-1] > 1:
        sizes.append(next(d for d in divisors(per_replica) if d <= sizes[-1] // 2))
    return sizes


# --------------------------------------------------------------------------- the search

def search(sizes: list[int], probe, *, estimate=None, budget: int | None = None) -> tuple:
    """The largest size of `sizes` (largest first) that fits.

    Args:
        sizes: candidates, largest first.
        probe: `probe(size)` -> peak bytes of one forward+backward; raises
            `tf.errors.ResourceExhaustedError` when the size does not fit.
        estimate: `estimate(size)` -> bytes (None: no estimate, every size is probed).
        budget: bytes a step may take, compared with `estimate` and the probe's peak (None:
            only out-of-memory errors decide, as on GPU/TPU).

    Returns:
        (size, how, peak_bytes): how is "estimate" or "probe".

    Raises:
        UserError: not even a micro-batch of 1 fits.
    """
    for size in sizes:
        guess = estimate(size) if estimate is not None and budget is not None else None
        if guess is not None and guess * SAFETY <= budget:
            return size, "estimate", None
        if guess is not None and guess > budget:
            logging.info("Micro-batch %d: estimated %.2f GB > budget %.2f GB, not probed", size,
                         guess / 1e9, budget / 1e9)
            continue
        try:
            peak = probe(size)
        except (tf.errors.ResourceExhaustedError, tf.errors.InternalError) as error:
            # A GPU library that cannot allocate its workspace (cuBLAS, cuDNN) reports an
            # InternalError naming the memory; any other InternalError is a real failure.
            if (isinstance(error, tf.errors.InternalError)
                    and not _OUT_OF_MEMORY.search(str(error.message))):
                raise
            logging.info("Micro-batch %d does not fit: %s", size,
                         str(error.message).splitlines()[0][:200])
            continue
        if budget is not None and peak > budget:
            logging.info("Micro-batch %d: peak %.2f GB > budget %.2f GB", size, peak / 1e9,
                         budget / 1e9)
            continue
        return size, "probe", peak
    raise UserError("not even a micro-batch of 1 example fits in memory; use a smaller model, "
                    "a shorter seq_length or mixed precision")


# ---------------------------------------------------------------------------- the probe

def synthetic_batch(element_spec: dict, size: int, seq_length: int | None) -> dict:
    """A batch of `size` examples shaped like the task's training batches, every sequence at
    `seq_length` (the longest a bucketed pipeline yields), every token real and every masked-LM
    prediction weighted (zeros would let a packed encoder or the masked LM skip the work)."""
    batch = {}
    for name, spec in element_spec.items():
        dims = spec.shape.as_list()
        if any(d is None for d in dims[1:]) and seq_length is None:
            raise ValueError(f"feature {name!r} has unknown dimensions {dims}")
        shape = [size] + [seq_length if d is None else d for d in dims[1:]]
        fill = tf.ones if name in (F.INPUT_MASK, F.MASKED_LM_WEIGHTS) else tf.zeros
        batch[name] = fill(shape, spec.dtype)
    return batch


def model_probe(task, model, strategy, *, seq_length: int | None, jit_compile: bool,
                on_cpu: bool):
    """`probe(size)`: one forward+backward of `model` on a synthetic batch of `size` per replica.

    On CPU it returns the peak RSS above the RSS before the first probe; elsewhere the device's
    peak memory.

    The weights and optimizer are untouched; the dropout seed states are put back afterwards
    so that a fitted run draws the masks an unfitted one draws.
    """
    spec = task.build_inputs(task.train_split, None, is_training=True).element_spec

    def replica_step(features):
        with tf.GradientTape() as tape:
            outputs = model(task.model_inputs(features), training=True)
            loss = tf.reduce_sum(tf.cast(task.build_losses(features, outputs)["loss"],
                                         tf.float32))
        grads = [g for g in tape.gradient(loss, model.trainable_variables) if g is not None]
        return loss + tf.add_n([tf.reduce_sum(tf.cast(g, tf.float32)) for g in grads]) * 0.0

    step = tf.function(replica_step, jit_compile=jit_compile or None, autograph=False)
    run = tf.function(lambda features: strategy.run(step, args=(features,)), autograph=False)
    seed_states = [v for v in model.non_trainable_variables
                   if v.path.endswith("seed_generator_state")]
    device = None if on_cpu else _first_device(strategy)
    # Before the first probe: the allocator may keep what a probe freed.
    base = memory.rss_bytes() if on_cpu else 0

    def probe(size: int) -> int:
        saved = [v.numpy() for v in seed_states]
        batch = synthetic_batch(spec, size, seq_length)
        try:
            if on_cpu:
                # Memory freed since `base` (caches, the allocator trimming) can put the
                # peak below it: nothing above the start is then 0 bytes.
                return max(0, memory.measure_peak_rss(lambda: run(batch)) - base)
            tf.config.experimental.reset_memory_stats(device)
            strategy.experimental_local_results(run(batch))[0].numpy()
            return int(tf.config.experimental.get_memory_info(device)["peak"])
        finally:
            for v, value in zip(seed_states, saved, strict=True):
                v.assign(value)

    return probe


def _first_device(strategy) -> str:
    try:
        return strategy.extended.worker_devices[0]
    except RuntimeError:  # the default strategy
        devices = tf.config.list_logical_devices("GPU") or tf.config.list_logical_devices("TPU")
        return (devices or tf.config.list_logical_devices("CPU"))[0].name


def on_cpu(strategy) -> bool:
    """Whether the strategy's replicas compute on CPUs."""
    return "CPU" in _first_device(strategy).upper()


def split_batches(dataset: tf.data.Dataset, micro_batch: int) -> tf.data.Dataset:
    """Each batch of `dataset` as consecutive batches of `micro_batch` rows, in order.

    Every feature's first dimension is the batch (its size a multiple of `micro_batch`); the
    other dimensions (a bucketed batch's sequence length) are kept, static where known.
    """
    def split(batch):
        def pieces(x):
            rest = [d if d is not None else tf.shape(x)[i + 1]
                    for i, d in enumerate(x.shape.as_list()[1:])]
            return tf.reshape(x, [-1, micro_batch, *rest])  # (pieces, micro_batch, ...)
        return tf.data.Dataset.from_tensor_slices(tf.nest.map_structure(pieces, batch))

    return dataset.flat_map(split)


# ----------------------------------------------------------------------------- the plan

def plan_batch(task, model, strategy, model_dir: str, *, task_batch: int,
               accumulation_steps: int = 1, micro_batch: int | None = None,
               seq_length: int | None = None,
               mixed_precision: str | None = None, jit_compile: bool = False,
               probe=None, budget: int | None = None) -> tuple[BatchPlan, dict]:
    """The plan of a run: cached, forced or fitted (see the module docstring).

    Args:
        task, model, strategy: the run's (the model built, under the strategy's scope).
        model_dir: where a cached plan is read (the trainer writes it with the run's files).
        task_batch: the task's training batch over all replicas (`global_batch_size(True)`).
        accumulation_steps: task batches per optimizer step (`TrainerConfig`'s, usually 1).
        micro_batch: force this micro-batch (None: cached, else fitted).
        seq_length: the longest training sequence (None: the batches' static shape).
        mixed_precision: None, "bfloat16" or "float16" (activations take 2 bytes).
        jit_compile: whether the training step is compiled with XLA (probed the same way).
        probe: replaces `model_probe` (tests).
        budget: CPU bytes a step may take (None: MEMORY_FRACTION of the available memory).

    Returns:
        (plan, key): key identifies what the plan was made for; pass both to `write_cached`.
    """
    plan, key = _decide(task, model, strategy, model_dir, task_batch=task_batch,
                        accumulation_steps=accumulation_steps, micro_batch=micro_batch,
                        seq_length=seq_length, mixed_precision=mixed_precision,
                        jit_compile=jit_compile, probe=probe, budget=budget)
    logging.info("%s", plan)
    peak = f", peak {plan.peak_bytes / 2**20:.1f} MiB" if plan.peak_bytes else ""
    logging.info("Micro-batch %d decided by: %s%s", plan.micro_batch, plan.how, peak)
    return plan, key


def _decide(task, model, strategy, model_dir, *, task_batch, accumulation_steps, micro_batch,
            seq_length, mixed_precision, jit_compile, probe, budget):
    replicas = strategy.num_replicas_in_sync
    per_replica = per_replica_batch(task_batch, replicas)
    key = {"task_batch": task_batch, "accumulation_steps": accumulation_steps,
           "replicas": replicas, "seq_length": seq_length, "mixed_precision": mixed_precision}
    if micro_batch is not None:
        plan = make_plan(task_batch, replicas, micro_batch, accumulation_steps=accumulation_steps)
        return plan, key
    cached = read_cached(model_dir, key, accumulation_steps)
    if cached is not None:
        return cached, key
    cpu = on_cpu(strategy)
    estimate = None
    if cpu:
        budget = int(MEMORY_FRACTION * memory.available_bytes()) if budget is None else budget
        per_example = memory.encoder_activation_bytes(model, seq_length, mixed_precision)
        if per_example is not None:
            params = sum(int(v.shape.num_elements()) for v in model.trainable_variables)

            def estimate(size):
                accumulating = size < per_replica or accumulation_steps > 1
                return memory.estimate_step_bytes(num_params=params, per_example=per_example,
                                                  micro_batch=size, accumulating=accumulating)
    else:
        budget = None  # out-of-memory errors decide
    if probe is None:
        probe = _lazy(lambda: model_probe(task, model, strategy, seq_length=seq_length,
                                          jit_compile=jit_compile, on_cpu=cpu))
    size, how, peak = search(candidates(per_replica), probe, estimate=estimate, budget=budget)
    return make_plan(task_batch, replicas, size, accumulation_steps=accumulation_steps, how=how,
                     peak_bytes=peak), key


def _lazy(make_probe):
    """A probe built on its first call: a plan the estimate decides never builds the input."""
    made = []

    def probe(size: int) -> int:
        if not made:
            made.append(make_probe())
        return made[0](size)

    return probe


# ---------------------------------------------------------------------------- the cache

def read_cached(model_dir: str, key: dict, accumulation_steps: int = 1) -> BatchPlan | None:
    """The plan cached in model_dir for the same `key` (task batch, replicas, ...); None
    when there is none, it is unreadable or it was made for another key."""
    path = os.path.join(model_dir, PLAN_FILE)
    try:
        with tf.io.gfile.GFile(path) as f:
            record = json.load(f)
        if record.get("key") != key:
            logging.info("The cached batch plan %s was made for %s, not %s: planning again",
                         path, record.get("key"), key)
            return None
        plan = record["plan"]
        return make_plan(key["task_batch"], key["replicas"], plan["micro_batch"],
                         accumulation_steps=accumulation_steps, how="cached",
                         peak_bytes=plan.get("peak_bytes"))
    except tf.errors.NotFoundError:
        return None
    except (ValueError, KeyError, TypeError, UserError, tf.errors.OpError) as error:
        logging.warning("Ignoring the unreadable batch plan %s (%s): planning again", path,
                        error)
        return None


def write_cached(model_dir: str, key: dict, plan: BatchPlan) -> str:
    """Writes model_dir/batch_plan.json (to a temporary sibling, renamed into place)."""
    path = os.path.join(model_dir, PLAN_FILE)
    record = {"key": key, "plan": dataclasses.asdict(plan)}
    storage.write_text_atomically(path, json.dumps(record, indent=2) + "\n")
    return path
