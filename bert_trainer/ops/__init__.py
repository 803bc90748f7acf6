"""The ops of a BERT step that have a fused CPU kernel, each choosing it or TensorFlow's own
ops in one place.

Layers, models and the optimizer call these and never the kernels. The choice is made when
an op is traced (`switch`): inside `fused_kernels(True / False / "auto")`, as that scope
says; outside any scope, as `BERT_TRAIN_FUSED_KERNELS` (auto / on / off) says. On "auto"
the kernels run on the CPU outside XLA only. The trainer traces its steps inside a scope of
the setting it was built under; the exporter inside `portable()`, so a SavedModel
holds only TensorFlow's ops and no data-dependent shapes.

Ops, by family (the kernels' sources, `bert_trainer/kernels/*.cc`, follow the same split):
  elementwise    dropout, gelu, layer_norm
  attention      attention_probabilities, split_heads, merge_heads (each with a packed
                 form), pack_rows, unpack_rows
  cross_entropy  sparse_softmax_cross_entropy, label_is_top
  adamw          apply_adamw
Questions for the models' speed choices: `dynamic_shapes_are_free()` (the CPU outside XLA)
and `token_packing_is_free()` (compute the real tokens only).
"""

from bert_trainer import autograph_rules  # noqa: F401 (AutoGraph leaves these modules as written)
from bert_trainer.ops.adamw import apply_adamw
from bert_trainer.ops.attention import (
    attention_probabilities,
    merge_heads,
    pack_rows,
    split_heads,
    unpack_rows,
)
from bert_trainer.ops.cross_entropy import (
    label_is_top,
    smoothed_cross_entropy,
    sparse_softmax_cross_entropy,
)
from bert_trainer.ops.elementwise import dropout, gelu, layer_norm
from bert_trainer.ops.switch import (
    MODE_ENV,
    MODES,
    default_mode,
    dynamic_shapes_are_free,
    fused,
    fused_kernels,
    mode,
    portable,
)


def token_packing_is_free() -> bool:
    """Whether an encoder traced here, now, should compute the real tokens only: where shapes
    may vary for free (`dynamic_shapes_are_free`: the CPU outside XLA, not an export). The
    fused kernels fold packing's copies into the heads' layout; TensorFlow's own ops pay a
    gather and a scatter around attention, far less than the padding's FLOPs they save on
    fine-tuning batches (benchmarks/README.md)."""
    return dynamic_shapes_are_free()


__all__ = [
    "MODES", "MODE_ENV", "apply_adamw", "attention_probabilities", "default_mode", "dropout",
    "dynamic_shapes_are_free", "fused", "fused_kernels", "gelu", "label_is_top", "layer_norm",
    "merge_heads", "mode", "pack_rows", "portable", "smoothed_cross_entropy",
    "sparse_softmax_cross_entropy", "split_heads", "token_packing_is_free", "unpack_rows",
]
