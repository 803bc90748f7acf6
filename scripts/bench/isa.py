"""What a benchmark row ran on: the CPU model and the instruction sets that decide matmul speed.

A bfloat16 step on a CPU with AMX (Intel Sapphire Rapids and later: `amx_tile`, `amx_bf16`)
runs its matrix products on tile units; with only AVX-512-BF16 (AMD Zen 4, Intel Cooper Lake)
it runs them as `vdpbf16ps` dot products; with neither, TensorFlow converts bfloat16 to float32
and gains nothing. The same row can therefore mean very different things on different
machines, so every results JSON records `isa_info()` and every table header prints
`isa_line()`.

oneDNN: TensorFlow's x86-64 Linux builds route matmuls, convolutions and some fused ops
through oneDNN unless `TF_ENABLE_ONEDNN_OPTS=0`; `ONEDNN_MAX_CPU_ISA` (`DNNL_MAX_CPU_ISA`)
caps the ISA oneDNN may use. Both are recorded as set in the environment.
"""

import os

# Matmul-relevant flags of /proc/cpuinfo, best first: the first one present is `matmul_isa`.
MATMUL_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f", "avx2")
ONEDNN_ENV = ("TF_ENABLE_ONEDNN_OPTS", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")
_OFF = ("0", "false", "off", "no")


def parse_cpuinfo(text: str) -> dict:
    """The first processor's model name and flags of a /proc/cpuinfo text.

    Returns:
      {"cpu_model": str or None, "flags": set of str}. The flags line is "flags" on x86 and
      "Features" on Arm; a text without either gives an empty set.
    """
    model, flags = None, None
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key = key.strip()
        if key == "model name" and model is None:
            model = value.strip()
        elif key in ("flags", "Features") and flags is None:
            flags = set(value.split())
    return {"cpu_model": model, "flags": flags or set()}


def _read_cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def onednn_state(environ=None) -> dict:
    """oneDNN's settings from the environment; `enabled` is TensorFlow's default when unset.

    TensorFlow (2.9 and later) enables oneDNN by default on x86-64 Linux; elsewhere it is off
    unless `TF_ENABLE_ONEDNN_OPTS=1`.
    """
    env = os.environ if environ is None else environ
    import platform  # noqa: PLC0415

    x86 = platform.machine().lower() in ("x86_64", "amd64")
    value = env.get("TF_ENABLE_ONEDNN_OPTS")
    enabled = x86 if value is None else value.strip().lower() not in _OFF
    return {"enabled": enabled, **{name: env.get(name) for name in ONEDNN_ENV}}


def isa_info(cpuinfo_text: str | None = None, environ=None) -> dict:
    """The CPU model, which matmul-relevant flags it has, the best of them, and oneDNN's state.

    Args:
      cpuinfo_text: a /proc/cpuinfo text (None: this machine's).
      environ: the environment to read oneDNN's settings from (None: os.environ).

    Returns:
      {"cpu_model", "flags": {flag: bool for MATMUL_FLAGS}, "amx": bool, "matmul_isa": the
      first flag of MATMUL_FLAGS present ("baseline" if none), "bf16_matmul": "amx",
      "avx512_bf16" or "emulated" (no bfloat16 instructions: converted to float32),
      "onednn": onednn_state()}.
    """
    parsed = parse_cpuinfo(_read_cpuinfo() if cpuinfo_text is None else cpuinfo_text)
    present = {flag: flag in parsed["flags"] for flag in MATMUL_FLAGS}
    amx = present["amx_bf16"] and present["amx_tile"]
    best = next((flag for flag in MATMUL_FLAGS if present[flag]), "baseline")
    bf16 = "amx" if amx else "avx512_bf16" if present["avx512_bf16"] else "emulated"
    return {"cpu_model": parsed["cpu_model"] or "unknown", "flags": present, "amx": amx,
            "matmul_isa": best, "bf16_matmul": bf16, "onednn": onednn_state(environ)}


def isa_line(info: dict) -> str:
    """One line for a table header, e.g. "AMD EPYC 9R14 · avx512_bf16 avx512f avx2, no AMX ·
    bf16 matmul: avx512_bf16 · oneDNN on (TF_ENABLE_ONEDNN_OPTS unset)"."""
    have = [flag for flag, on in info["flags"].items() if on]
    amx = "AMX" if info["amx"] else "no AMX"
    onednn = info["onednn"]
    setting = onednn.get("TF_ENABLE_ONEDNN_OPTS")
    setting = "unset" if setting is None else repr(setting)
    capped = [f"{name}={onednn[name]}" for name in ONEDNN_ENV[1:] if onednn.get(name)]
    return (f"{info['cpu_model']} · {' '.join(have) or 'no AVX2/AVX-512'}, {amx} · bf16 matmul: "
            f"{info['bf16_matmul']} · oneDNN {'on' if onednn['enabled'] else 'off'} "
            f"(TF_ENABLE_ONEDNN_OPTS {setting}{''.join(', ' + c for c in capped)})")
