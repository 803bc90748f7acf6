"""`bert-train doctor`: what a run on this machine will use, and what is off and why.

Prints TensorFlow's version, the CPU and its vector units, whether the fused CPU kernels are
built (for which instruction set) or why not, whether bfloat16 is native here, and the
devices a strategy would use. Paste its output into a bug report.
"""

from bert_trainer import diagnostics


def main(argv):
    del argv
    lines = diagnostics.report()
    width = max(len(label) for label, _ in lines)
    for label, text in lines:
        print(f"{label:<{width}}  {text}")
    return 0
