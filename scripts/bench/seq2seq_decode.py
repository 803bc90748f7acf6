#!/usr/bin/env python3
"""Decoding speed of a Seq2SeqTransformer with and without its key/value cache.

Times `translate` (bert_trainer.models.generation.seq2seq) on one batch of sources, greedy and
beam 4, each with the cache (one new position per step) and without it (the decoder's blocks
re-run on the whole prefix every step, the encoder run once either way; both project only the
newest position on the vocabulary, from the table transposed once per call), plus greedy and
beam 4 with the cache and translate's opt-in `jit_compile` (the cached loop under XLA; `*_xla`
rows, ratios against the same uncompiled uncached baseline). The weights are random and the
end and pad tokens can never win (their output bias is -1e9), so every variant decodes exactly
`max_decode_length` tokens per row: the same work, whatever the weights. Tokens/s counts the
returned tokens (batch x max_decode_length), so a ratio of tokens/s is a ratio of times.

Method: each variant is one `tf.function` (its own graph, XLA with --xla), traced and run once
untimed; then `rounds` rounds time every variant in turn, A B C D A B C D ..., so drifts of
machine load hit all alike; a variant's time is its median over rounds. All variants share one
process and one model (the comparison is of the decoding loops, not of builds). The check:
beam 4 with the cache, run as `translate` runs it by default (the XLA-compiled loop,
`beam4_cached_xla`), >= 5x the tokens/s of beam 4 without the cache; the graph executor's
cached loop (`beam4_cached`, what an export runs) is reported beside it. The ratio grows with
max_decode_length (the uncached work is quadratic in it, the cached work linear).

  scripts/bench/seq2seq_decode.py --output benchmarks/results_seq2seq_decode.json
  scripts/bench/seq2seq_decode.py --smoke --output /tmp/d.json    # tiny sizes, seconds
"""

import argparse
import pathlib
import statistics
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # scripts/ for bench
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository

from bench import report  # noqa: E402

TARGET_BEAM_RATIO = 5.0
START_ID, END_ID = 1, 2


def build_model(args):
    """A random-weight Seq2SeqTransformer whose decoding never ends before max length."""
    import keras  # noqa: PLC0415

    from bert_trainer.encoders import BertEncoder  # noqa: PLC0415
    from bert_trainer.models import Seq2SeqTransformer  # noqa: PLC0415

    keras.utils.set_random_seed(0)
    encoder = BertEncoder(
        vocab_size=args.vocab_size, hidden_size=args.hidden_size, num_layers=args.num_layers,
        num_attention_heads=args.num_attention_heads, inner_dim=4 * args.hidden_size,
        max_sequence_length=max(args.source_length, args.max_decode_length), type_vocab_size=2,
        output_dropout=0.0, attention_dropout=0.0)
    model = Seq2SeqTransformer(encoder, max_target_length=args.max_decode_length)
    bias = [0.0] * args.vocab_size
    bias[0] = bias[END_ID] = -1e9  # no hypothesis ever finishes: fixed work per variant
    model.output_bias.assign(bias)
    return model


def sources(args):
    """One batch of encoder inputs: random word ids, no padding."""
    import tensorflow as tf  # noqa: PLC0415

    from bert_trainer import features  # noqa: PLC0415

    shape = (args.batch_size, args.source_length)
    ids = tf.random.stateless_uniform(shape, (1, 2), minval=3, maxval=args.vocab_size,
                                      dtype=tf.int32)
    return {features.INPUT_WORD_IDS: ids, features.INPUT_MASK: tf.ones(shape, tf.int32),
            features.INPUT_TYPE_IDS: tf.zeros(shape, tf.int32)}


def variants(args, model):
    """{name: tf.function decoding one batch} for greedy/beam 4 x cache/no cache."""
    import tensorflow as tf  # noqa: PLC0415

    from bert_trainer.models.generation import seq2seq as seq2seq_generation  # noqa: PLC0415

    def make(beam_size, use_cache, loop_jit=False):
        def decode(inputs):
            return seq2seq_generation.translate(
                model, inputs, beam_size=beam_size, length_penalty=0.6,
                max_decode_length=args.max_decode_length, start_id=START_ID, end_id=END_ID,
                use_cache=use_cache, jit_compile=loop_jit)
        return tf.function(decode, jit_compile=args.xla)

    functions = {f"{name}_{'cached' if cache else 'uncached'}": make(beam, cache)
                 for name, beam in (("greedy", 1), ("beam4", 4)) for cache in (True, False)}
    if not args.xla:  # translate's opt-in jit_compile (the cached loop under XLA): extra rows
        functions.update(greedy_cached_xla=make(1, True, True),
                         beam4_cached_xla=make(4, True, True))
    return functions


def measure(args, functions, inputs):
    """Warm-up (trace, compile) then alternating timed rounds; per variant the timings."""
    from bert_trainer import features  # noqa: PLC0415

    results = {}
    for name, fn in functions.items():
        start = time.perf_counter()
        ids = fn(inputs)[features.DECODED_IDS].numpy()
        # Fixed work: every row must have decoded max_decode_length tokens, no end, no 0.
        assert ((ids != 0) & (ids != END_ID)).all(), (
            f"{name}: a row ended early; the comparison needs equal work")
        results[name] = {"warmup_s": time.perf_counter() - start, "seconds": []}
        print(f"  {name}: traced and ran once in {results[name]['warmup_s']:.1f} s", flush=True)
    for _ in range(args.rounds):
        for name, fn in functions.items():
            start = time.perf_counter()
            fn(inputs)[features.DECODED_IDS].numpy()
            results[name]["seconds"].append(time.perf_counter() - start)
        print("  round: " + ", ".join(f"{name} {entry['seconds'][-1]:.3f} s"
                                      for name, entry in results.items()), flush=True)
    tokens = args.batch_size * args.max_decode_length
    for entry in results.values():
        entry["median_s"] = statistics.median(entry["seconds"])
        entry["tokens_per_s"] = tokens / entry["median_s"]
    return results


def run(args) -> dict:
    import tensorflow as tf  # noqa: PLC0415

    tf.config.threading.set_intra_op_parallelism_threads(args.threads or 0)
    model = build_model(args)
    timings = measure(args, variants(args, model), sources(args))
    ratios = {kind: timings[f"{kind}_cached"]["tokens_per_s"]
              / timings[f"{kind}_uncached"]["tokens_per_s"] for kind in ("greedy", "beam4")}
    # The compiled loop against the same (uncompiled: it cannot compile) uncached baseline.
    ratios.update({f"{kind}_xla": timings[f"{kind}_cached_xla"]["tokens_per_s"]
                   / timings[f"{kind}_uncached"]["tokens_per_s"]
                   for kind in ("greedy", "beam4") if f"{kind}_cached_xla" in timings})
    # translate's default loop: XLA-compiled (with --xla every row is, and has no _xla twin).
    default = "beam4_xla" if "beam4_xla" in ratios else "beam4"
    return {
        "what": "seq2seq decoding tokens/s with vs without the key/value cache",
        "settings": {k: v for k, v in vars(args).items() if k not in ("output",)},
        "machine": report.machine_info(),
        "variants": timings,
        "cache_speedup": ratios,
        "target": {"beam4_cache_speedup_min": TARGET_BEAM_RATIO, "ratio": default,
                   "met": ratios[default] >= TARGET_BEAM_RATIO},
    }


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output", default="benchmarks/results_seq2seq_decode.json",
                   help="results JSON (written whole, via a temporary sibling)")
    # Defaults: the size of the seq2seq benchmark's Transformer (4/256/4/1024, 8,000 tokens)
    # and its longest target; about 3 minutes on 2 busy cores.
    p.add_argument("--vocab_size", type=int, default=8000)
    p.add_argument("--hidden_size", type=int, default=256)
    p.add_argument("--num_layers", type=int, default=4)
    p.add_argument("--num_attention_heads", type=int, default=4)
    p.add_argument("--batch_size", type=int, default=4)
    p.add_argument("--source_length", type=int, default=24)
    p.add_argument("--max_decode_length", type=int, default=64,
                   help="tokens decoded per row (all of them: the end token is disabled)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (0: TF's choice)")
    p.add_argument("--xla", action="store_true", help="compile each whole variant with XLA "
                   "(replaces the *_xla rows; the uncached ones may not compile)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes: checks the script only")
    args = p.parse_args(argv)
    if args.smoke:
        args.vocab_size, args.hidden_size, args.num_layers = 64, 32, 1
        args.batch_size, args.source_length, args.max_decode_length, args.rounds = 2, 6, 6, 2
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    results = run(args)
    report.write_json(args.output, results)
    for name, entry in results["variants"].items():
        print(f"{name:16s} {entry['tokens_per_s']:10.1f} tokens/s  (median {entry['median_s']:.3f}"
              f" s over {len(entry['seconds'])} rounds)")
    for kind, ratio in results["cache_speedup"].items():
        print(f"{kind}: cache speedup {ratio:.2f}x")
    verdict = "met" if results["target"]["met"] else "NOT met"
    print(f"target {results['target']['ratio']} >= {TARGET_BEAM_RATIO}x: {verdict}; "
          f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
