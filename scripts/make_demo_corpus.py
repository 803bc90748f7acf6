"""Builds the embedded demo pretraining corpus from the Python standard library's own text.

  python scripts/make_demo_corpus.py --output=runs/demo/corpus.txt [--max_bytes=N]

See bert_trainer/demo/corpus.py for what it reads and how it cleans it.
"""

import argparse
import json
import sys

from bert_trainer.demo.corpus import build_demo_corpus


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", required=True, help="Text file to write.")
    parser.add_argument("--max_bytes", type=int, default=None,
                        help="Stop after about this many bytes (default: everything).")
    args = parser.parse_args(argv)
    stats = build_demo_corpus(args.output, max_bytes=args.max_bytes)
    print(json.dumps(stats))
    print(f"demo corpus: {stats['documents']:,} documents, {stats['sentences']:,} sentences, "
          f"{stats['words']:,} words -> {stats['output']}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
