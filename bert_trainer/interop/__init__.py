"""Published BERT checkpoints in and out: Hugging Face, Google TF1, and the bert-train layout.

`resolve_checkpoint(path)` (`resolve.py`) detects the format of any checkpoint once and gives
its encoder config, vocabulary and a loader; `from_pretrained(path)` builds and loads an encoder
with it. `read_checkpoint(path)` reads a Hugging Face or Google TF1 directory into a validated
`BertCheckpoint` in the reference (Google) layout; `hf.write_hf` writes one back. Mapping that
layout onto Keras layers lives in `pretrained.py`. Hugging Face GPT-2 checkpoints load into a
`CausalLM` (`gpt2.py`; resolved as the format "gpt2").
"""

from bert_trainer.interop import formats, gpt2, hf, tf1  # noqa: F401 (the package's modules)
from bert_trainer.interop.formats import BertCheckpoint, BertConfig, detect_format

__all__ = ["BertCheckpoint", "BertConfig", "ResolvedCheckpoint", "detect_format",
           "from_pretrained", "read_checkpoint", "resolve_checkpoint"]


def read_checkpoint(path: str, *, allow_pickle: bool = False) -> BertCheckpoint:
    """Reads a Hugging Face or Google TF1 BERT directory (format detected).

    Args:
      path: the directory.
      allow_pickle: also accept a pickle `pytorch_model.bin` (needs torch).

    Returns:
      The validated `BertCheckpoint`.

    Raises:
      UserError: unknown layout, missing files, or config/weights/vocab that do not fit; a
        bert-train model directory (read it with `resolve_checkpoint` instead).
    """
    return resolve_checkpoint(path, allow_pickle=allow_pickle).read_reference()


# Imported last: resolve.py reads the modules above through this package.
from bert_trainer.interop.resolve import (  # noqa: E402
    ResolvedCheckpoint,
    from_pretrained,
    resolve_checkpoint,
)
