"""Google BERT TF1 directories (`bert_config.json`, `bert_model.ckpt.*`, `vocab.txt`).

The variable names of google-research/bert `modeling.py` are the reference names of
`formats.py`, so reading is a lookup: `tf.train.load_checkpoint` gives the arrays, and
everything else in the checkpoint (Adam slots `*/adam_m`, `*/adam_v`, `global_step`) is ignored.
"""

import os

import tensorflow as tf

from bert_trainer.errors import UserError, first_line
from bert_trainer.interop import formats


def read_tf1(path: str) -> formats.BertCheckpoint:
    """Reads a Google BERT TF1 directory into the reference layout, validated.

    Args:
      path: directory holding bert_config.json, bert_model.ckpt.{index,data-*} and vocab.txt.

    Returns:
      A `BertCheckpoint`. `lower_case` follows Google's naming: a directory named `cased_*`
      (or containing `_cased`) is cased, every other one uncased.
    """
    config_file = os.path.join(path, formats.TF1_CONFIG)
    config = formats.BertConfig.from_json(config_file)
    prefix = formats.tf1_prefix(path)
    try:
        reader = tf.train.load_checkpoint(prefix)
    except (tf.errors.OpError, ValueError) as e:
        raise UserError(f"{prefix}.index could not be read as a TF checkpoint "
                        f"({first_line(e)}); re-download the checkpoint files") from None
    shapes = reader.get_variable_to_shape_map()
    held = sum(1 for n in shapes if n.endswith("attention/self/query/kernel"))
    wanted = _reference_names(max(held, config.num_layers))
    # The shapes the index declares, against the config, before any tensor is read.
    formats.check_fit(config, {n: tuple(s) for n, s in shapes.items() if n in wanted},
                      config_file=config_file, weights_file=prefix + ".index")
    weights = {n: formats.float_weight(n, reader.get_tensor(n), prefix + ".index")
               for n in shapes if n in wanted}
    ckpt = formats.BertCheckpoint(
        config=config, weights=weights, vocab_file=formats.find_vocab(path, required=True),
        lower_case=lower_case(path), weights_file=prefix + ".index", config_file=config_file)
    formats.validate(ckpt)
    return ckpt


def _reference_names(num_layers: int) -> set[str]:
    # Only the names matter here; the shapes are checked by formats.validate.
    config = formats.BertConfig(vocab_size=1, hidden_size=1, num_layers=num_layers,
                                num_attention_heads=1, inner_dim=1, max_sequence_length=1)
    return {n for g in formats.GROUPS for n in formats.reference_shapes(config, g)}


def lower_case(path: str) -> bool:
    """Google's naming: a directory named `cased_*` (or holding `_cased`) is cased."""
    name = os.path.basename(os.path.normpath(path)).lower()
    return not (name.startswith("cased") or "_cased" in name or "-cased" in name)


