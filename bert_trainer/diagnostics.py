"""What a run on this machine will use: the facts `bert-train doctor` prints.

TensorFlow and its libraries, the CPU and the vector units that matter for a BERT step
(AVX2, AVX-512, AVX512_BF16, AVX-512 FP16, AMX; NEON, SVE and BF16 on Arm), whether the fused
CPU kernels are built (and for which instruction set) or why not, whether bfloat16 is native
here and what its matmuls gain over float32's (measured), and the devices a `tf.distribute`
strategy would run on.
"""

import os
import platform
import sys
import time

# /proc/cpuinfo flag -> what a reader calls it, in the order printed.
X86_FEATURES = (("avx2", "AVX2"), ("fma", "FMA"), ("avx512f", "AVX-512"),
                ("avx512_bf16", "AVX512_BF16"), ("avx512_fp16", "AVX-512 FP16"),
                ("amx_tile", "AMX"), ("amx_bf16", "AMX-BF16"))
ARM_FEATURES = (("asimd", "NEON"), ("sve", "SVE"), ("bf16", "BF16"), ("i8mm", "I8MM"))


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_features(flags: set[str]) -> list[tuple[str, bool]]:
    """(name, present) for the features that matter, for this machine's architecture."""
    from bert_trainer.kernels import targets  # noqa: PLC0415

    table = ARM_FEATURES if targets.machine() == "aarch64" else X86_FEATURES
    return [(name, flag in flags) for flag, name in table]


BF16_ADVICE = ("the better choice for training here: --gin_param='TrainerConfig."
               "mixed_precision=\"bfloat16\"' (float32 weights and losses; its pretraining "
               "loss follows float32's, benchmarks/README.md)")


# The measured matmul speed-up below which bfloat16 is not worth its rounding: a training step
# gains less than its matmuls (the rest of the step stays float32).
BF16_WORTH_IT = 1.3
# The matmul `matmul_speedup` times: a BERT-base feed-forward layer's, 512 tokens.
BF16_PROBE_SHAPE = (512, 768, 3072)
# oneDNN instruction-set caps (ONEDNN_MAX_CPU_ISA) whose matmuls take bfloat16 (emulated on
# AVX512_CORE). Under a lower cap (AVX2, AVX2_VNNI, ...) oneDNN cannot build a bfloat16 matmul
# and aborts the process; so it does on a CPU without AVX-512, where it stops at AVX2.
ONEDNN_BF16_ISAS = ("AVX512_CORE", "AVX512_CORE_VNNI", "AVX2_VNNI_2", "AVX512_CORE_BF16",
                    "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16",
                    "AVX10_1_512", "AVX10_1_512_AMX", "AVX10_1_512_AMX_FP16", "AVX10_2_512",
                    "AVX10_2_512_AMX_2", "ALL")
# The AVX-512 subsets oneDNN's AVX512_CORE level needs (/proc/cpuinfo names).
AVX512_CORE_FLAGS = frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq"})


def onednn_bf16_cap(environ=os.environ) -> str | None:
    """The ONEDNN_MAX_CPU_ISA cap that keeps TensorFlow's oneDNN from bfloat16 matmuls, or
    None (no cap, a cap with bfloat16, or oneDNN off: TF_ENABLE_ONEDNN_OPTS=0)."""
    cap = environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    if not cap or environ.get("TF_ENABLE_ONEDNN_OPTS", "").strip() == "0":
        return None
    return None if cap in ONEDNN_BF16_ISAS else cap


def matmul_speedup(shape: tuple[int, int, int] = BF16_PROBE_SHAPE, repeats: int = 5) -> float:
    """How many times faster a bfloat16 matmul of `shape` ([m, k] x [k, n]) runs here than a
    float32 one: the best of `repeats` timed calls each, after a warm-up (about a second)."""
    import tensorflow as tf  # noqa: PLC0415

    m, k, n = shape

    def best_seconds(dtype) -> float:
        a = tf.cast(tf.random.stateless_normal([m, k], seed=[1, 2]), dtype)
        b = tf.cast(tf.random.stateless_normal([k, n], seed=[3, 4]), dtype)
        matmul = tf.function(lambda x, y: tf.reduce_sum(tf.cast(tf.matmul(x, y), tf.float32)))
        matmul(a, b).numpy()  # traced and warmed up
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            matmul(a, b).numpy()
            times.append(time.perf_counter() - start)
        return min(times)

    return best_seconds(tf.float32) / best_seconds(tf.bfloat16)


def onednn_bfloat16_problem(flags: set[str], environ=os.environ) -> str | None:
    """Why TensorFlow's oneDNN cannot run a bfloat16 matmul on this x86 CPU (it aborts the
    process on one: dnnl::error, SIGABRT), or None where it can (or oneDNN is off, or the CPU
    is not x86: TensorFlow's own kernels then run bfloat16, emulated where need be)."""
    if environ.get("TF_ENABLE_ONEDNN_OPTS", "").strip() == "0":
        return None
    if not {"sse2", "avx", "avx2"} & flags:  # not x86
        return None
    cap = onednn_bf16_cap(environ)
    if cap is not None:
        return f"ONEDNN_MAX_CPU_ISA={cap} holds TensorFlow's oneDNN below bfloat16"
    if not (AVX512_CORE_FLAGS <= flags or "amx_bf16" in flags):
        return "this CPU has no AVX-512, below which TensorFlow's oneDNN has no bfloat16 matmul"
    return None


def bfloat16_support(flags: set[str], speedup: float | None = None,
                     problem: str | None = None) -> str:
    """How bfloat16 matmuls run on a CPU with these feature flags, and whether to use it.

    Args:
      flags: the CPU's feature flags (`kernels.targets.cpu_flags()`).
      speedup: bfloat16 matmuls' speed over float32's measured here (`matmul_speedup`), or
        None (not measured: the advice follows the instructions alone).
      problem: `onednn_bfloat16_problem(flags)`: why bfloat16 cannot run here, or None.
    """
    if problem is not None:
        return (f"unavailable: {problem} (a bfloat16 run would abort): keep float32, the "
                "default")
    if {"amx_bf16", "amx_tile"} <= flags:
        how = "native (AMX tiles)"
    elif "avx512_bf16" in flags:
        how = "native (AVX512_BF16 dot products)"
    elif "bf16" in flags:
        how = "native (Arm BF16)"
    else:
        how = "emulated (no bfloat16 instructions)"
    measured = ""
    if speedup is not None:
        m, k, n = BF16_PROBE_SHAPE
        measured = (f"; measured here, a bfloat16 matmul ({m}x{k}x{n}) runs {speedup:.2f}x "
                    "float32's, and a training step gains less")
    if how.startswith("emulated") or (speedup is not None and speedup < BF16_WORTH_IT):
        return f"{how}{measured}: keep float32, the default"
    if speedup is None and how == "native (Arm BF16)":
        return f"{how}: likely faster than float32 for training, not measured here"
    return f"{how}{measured}: {BF16_ADVICE}"


def kernels_report() -> str:
    """The fused kernels' state: built (where, for which instruction set) or why not."""
    from bert_trainer import kernels  # noqa: PLC0415
    from bert_trainer.kernels import build  # noqa: PLC0415
    from bert_trainer.ops import switch  # noqa: PLC0415

    mode = switch.default_mode()
    if mode == "off":
        return f"off ({switch.MODE_ENV}=off: TensorFlow's own ops)"
    state = kernels.status()
    if not state["loaded"]:
        return "NOT available: " + kernels.unavailable_message(state["error"])
    flags = " ".join(build.arch_flags(state["target"])) if _has_compiler() else state["target"]
    note = f"; {state['note']}" if state["note"] else ""
    return (f"built for {flags} ({state['path']}); used on the CPU outside XLA "
            f"({switch.MODE_ENV}={mode}){note}")


def _has_compiler() -> bool:
    from bert_trainer.kernels import build  # noqa: PLC0415

    try:
        build.compiler()
        return True
    except build.BuildError:
        return False


def devices_report() -> str:
    import tensorflow as tf  # noqa: PLC0415

    found = {kind: tf.config.list_logical_devices(kind) for kind in ("CPU", "GPU", "TPU")}
    parts = [f"{len(v)} {k}" for k, v in found.items() if v]
    replicas = len(found["GPU"]) or 1
    return (f"{', '.join(parts)}; --strategy=mirrored would run {replicas} replica(s) on "
            f"{', '.join(d.name for d in (found['GPU'] or found['CPU'][:1]))}")


def _positive_int(text: str | None) -> int | None:
    """`text` as TensorFlow reads a thread-count variable: an integer > 0, else None."""
    try:
        value = int(text or "")
    except ValueError:
        return None
    return value if value > 0 else None


def _bfloat16_line(flags: set[str]) -> str:
    """doctor's bfloat16 line: measured where bfloat16 can run here (native instructions, no
    oneDNN cap below it), else from the instructions alone (emulated: keep float32)."""
    problem = onednn_bfloat16_problem(flags)
    native = bool({"avx512_bf16", "amx_bf16", "bf16"} & flags)
    speedup = matmul_speedup() if native and problem is None else None
    return bfloat16_support(flags, speedup, problem=problem)


def report() -> list[tuple[str, str]]:
    """(label, text) lines describing what a run here will use."""
    import keras  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    from bert_trainer.kernels import targets  # noqa: PLC0415

    flags = targets.cpu_flags()
    features = ", ".join(f"{name} {'yes' if ok else 'no'}" for name, ok in cpu_features(flags))
    threads = (tf.config.threading.get_intra_op_parallelism_threads()
               or _positive_int(os.environ.get("TF_NUM_INTRAOP_THREADS")) or os.cpu_count())
    onednn = os.environ.get("TF_ENABLE_ONEDNN_OPTS", "1 (default)")
    return [
        ("python", f"{sys.version.split()[0]} on {platform.system()} {platform.machine()}"),
        ("tensorflow", f"{tf.__version__} (keras {keras.__version__}; oneDNN "
                       f"TF_ENABLE_ONEDNN_OPTS={onednn})"),
        ("cpu", f"{cpu_model()}, {os.cpu_count()} logical cores, {threads} intra-op threads"),
        ("cpu features", features or "unknown (no /proc/cpuinfo)"),
        ("fused kernels", kernels_report()),
        ("bfloat16", _bfloat16_line(flags)),
        ("devices", devices_report()),
    ]
