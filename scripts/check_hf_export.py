"""Loads a Hugging Face BERT directory with `transformers` and compares it to a golden file.

Run it in an environment that has torch and transformers (bert-train itself needs neither), to
check that a `bert-train convert --to=hf` output loads in `transformers.BertModel` and computes
what the reference computed:

    python scripts/check_hf_export.py --hf_dir=/tmp/minilm_hf \
        --golden=../shared/fixtures/minilm/golden.npz

It prints, for each of HF's attention implementations, the max |difference| from the golden
outputs, split into real-token and padding positions. Exits 1 if `--bound` is exceeded at a
real token (padding positions are reported, not judged: no model output depends on them).
"""

import argparse
import sys

import numpy as np


def compare(hf_dir: str, golden: dict, attn_implementation: str) -> dict[str, tuple[float, float]]:
    """Max |diff| at (real, padding) positions for every hidden state, sequence and pooled."""
    import torch
    import transformers

    model = transformers.BertModel.from_pretrained(hf_dir, attn_implementation=attn_implementation)
    model.eval()
    as_long = {k: torch.tensor(golden[k]).long()
               for k in ("input_word_ids", "input_mask", "input_type_ids")}
    with torch.no_grad():
        out = model(input_ids=as_long["input_word_ids"], attention_mask=as_long["input_mask"],
                    token_type_ids=as_long["input_type_ids"], output_hidden_states=True)
    real = golden["input_mask"].astype(bool)
    outputs = {f"hidden_states[{i}]": (h.numpy(), golden["hidden_states"][i])
               for i, h in enumerate(out.hidden_states)}
    outputs["sequence_output"] = (out.last_hidden_state.numpy(), golden["sequence_output"])
    report = {}
    for name, (ours, ref) in outputs.items():
        diff = np.abs(ours - ref).max(-1)  # [batch, seq]
        report[name] = (float(diff[real].max()), float(diff[~real].max(initial=0.0)))
    pooled = float(np.abs(out.pooler_output.numpy() - golden["pooled_output"]).max())
    report["pooled_output"] = (pooled, 0.0)
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hf_dir", required=True)
    parser.add_argument("--golden", required=True)
    parser.add_argument("--bound", type=float, default=1e-4)
    args = parser.parse_args()
    golden = dict(np.load(args.golden))
    worst = 0.0
    for impl in ("sdpa", "eager"):
        print(f"transformers.BertModel ({impl}) vs {args.golden}: max |diff| real / padding")
        for name, (real, pad) in compare(args.hf_dir, golden, impl).items():
            print(f"  {name:18s} {real:.2e} / {pad:.2e}")
            worst = max(worst, real)
    print(f"worst at real tokens: {worst:.2e} (bound {args.bound:.0e})")
    return 0 if worst <= args.bound else 1


if __name__ == "__main__":
    sys.exit(main())
