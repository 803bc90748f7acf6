"""Writes tests/data/gpt2_tiny/: a small random GPT-2 in Hugging Face layout and its outputs.

The parity test of bert-train's GPT-2 reader (`tests/interop/test_interop_gpt2.py`) loads these
weights into a `CausalLM` and compares its logits and its greedy generation with the ones
Hugging Face `transformers`' `GPT2LMHeadModel` computed here, in float32 on CPU. torch is not
a test dependency: run this script wherever torch and transformers are installed, and commit
its output.

Files written:
  config.json, model.safetensors   `GPT2LMHeadModel.save_pretrained` (keys "transformer.*";
                                    the tied lm_head is not stored)
  golden.npz                       input_ids [3, 16] int32, logits [3, 16, vocab] float32,
                                    hidden [3, 16, n_embd] (after ln_f), greedy_prompt [2, 5],
                                    greedy_ids [2, 5 + 10] (prompt + 10 greedy tokens,
                                    `generate(do_sample=False, use_cache=True)`)
  source.json                      versions of torch and transformers, the seed

The weights are drawn wider than GPT-2's 0.02 initialization (normal, std 0.3; LayerNorm
gains around 1) so that every layer changes the logits visibly.

Usage (from the repository root):
  python scripts/make_gpt2_golden.py [--out tests/data/gpt2_tiny]
"""

import argparse
import json
import os

import numpy as np
import torch
import transformers

OUT = os.path.join(os.path.dirname(__file__), "..", "tests", "data", "gpt2_tiny")
SEED = 0


def make_model() -> "transformers.GPT2LMHeadModel":
    config = transformers.GPT2Config(
        vocab_size=99, n_positions=32, n_embd=32, n_layer=2, n_head=4,
        activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        layer_norm_epsilon=1e-5, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(SEED)
    model = transformers.GPT2LMHeadModel(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            else:
                param.copy_(0.3 * torch.randn_like(param))
    model.eval()
    return model


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=OUT)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    model = make_model()
    model.save_pretrained(args.out, safe_serialization=True)

    rng = np.random.default_rng(SEED)
    input_ids = rng.integers(3, model.config.vocab_size, size=(3, 16)).astype(np.int32)
    with torch.no_grad():
        out = model(torch.tensor(input_ids, dtype=torch.long), output_hidden_states=True)
    logits = out.logits.numpy().astype(np.float32)
    hidden = out.hidden_states[-1].numpy().astype(np.float32)  # after ln_f

    prompt = rng.integers(3, model.config.vocab_size, size=(2, 5)).astype(np.int32)
    with torch.no_grad():
        greedy = model.generate(torch.tensor(prompt, dtype=torch.long),
                                attention_mask=torch.ones(prompt.shape, dtype=torch.long),
                                max_new_tokens=10, min_new_tokens=10, do_sample=False,
                                use_cache=True, pad_token_id=0)
    np.savez(os.path.join(args.out, "golden.npz"), input_ids=input_ids, logits=logits,
             hidden=hidden, greedy_prompt=prompt, greedy_ids=greedy.numpy().astype(np.int32))
    with open(os.path.join(args.out, "source.json"), "w", encoding="utf-8") as f:
        json.dump({"script": "scripts/make_gpt2_golden.py", "seed": SEED,
                   "torch": torch.__version__, "transformers": transformers.__version__,
                   "model": "GPT2LMHeadModel, float32, CPU"}, f, indent=1)
    print("wrote", sorted(os.listdir(args.out)))


if __name__ == "__main__":
    main()
