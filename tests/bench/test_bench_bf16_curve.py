"""The bf16-vs-fp32 loss-curve benchmark (scripts/bench/bf16_curve.py) and the ISA helper that
every benchmark's results record (scripts/bench/isa.py)."""

import json
import math
import os
import pathlib
import subprocess
import sys

import pytest
from conftest import REPO

SCRIPTS = REPO / "scripts"
sys.path.insert(0, str(SCRIPTS))

from bench import bf16_curve_report, isa, report  # noqa: E402

# Abridged /proc/cpuinfo texts of real CPUs (the fields the helper reads, and some it must skip).
SAPPHIRE_RAPIDS = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8488C
flags\t\t: fpu vme sse sse2 avx avx2 fma avx512f avx512dq avx512cd avx512bw avx512vl \
avx512_vnni avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8
bugs\t\t: spectre_v1

processor\t: 1
model name\t: Intel(R) Xeon(R) Platinum 8488C
flags\t\t: fpu
"""
ZEN4 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9R14
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512dq avx512bw avx512vl avx512_bf16 avx512_vnni
"""
HASWELL = "model name\t: Intel(R) Xeon(R) CPU E5-2676 v3\nflags\t\t: fpu sse2 avx avx2 fma\n"
GRAVITON = "processor\t: 0\nBogoMIPS\t: 243.75\nFeatures\t: fp asimd bf16 i8mm sve\n"


def test_isa_with_amx():
    info = isa.isa_info(SAPPHIRE_RAPIDS, environ={})
    assert info["cpu_model"] == "Intel(R) Xeon(R) Platinum 8488C"  # the first processor's
    assert info["flags"] == {"amx_bf16": True, "amx_tile": True, "avx512_bf16": True,
                             "avx512f": True, "avx2": True}
    assert info["amx"] is True and info["bf16_matmul"] == "amx"
    assert info["matmul_isa"] == "amx_bf16"
    line = isa.isa_line(info)
    assert "Platinum 8488C" in line and ", AMX" in line and "no AMX" not in line


def test_isa_without_amx():
    zen4 = isa.isa_info(ZEN4, environ={"TF_ENABLE_ONEDNN_OPTS": "0"})
    assert zen4["flags"] == {"amx_bf16": False, "amx_tile": False, "avx512_bf16": True,
                             "avx512f": True, "avx2": True}
    assert zen4["amx"] is False and zen4["bf16_matmul"] == "avx512_bf16"
    assert zen4["matmul_isa"] == "avx512_bf16"
    assert zen4["onednn"]["enabled"] is False and zen4["onednn"]["TF_ENABLE_ONEDNN_OPTS"] == "0"
    line = isa.isa_line(zen4)
    assert "no AMX" in line and "oneDNN off (TF_ENABLE_ONEDNN_OPTS '0')" in line
    haswell = isa.isa_info(HASWELL, environ={"TF_ENABLE_ONEDNN_OPTS": "1",
                                             "ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert haswell["matmul_isa"] == "avx2" and haswell["bf16_matmul"] == "emulated"
    assert haswell["onednn"]["enabled"] is True
    assert "ONEDNN_MAX_CPU_ISA=AVX2" in isa.isa_line(haswell)
    arm = isa.isa_info(GRAVITON, environ={})
    assert arm["cpu_model"] == "unknown" and not any(arm["flags"].values())
    assert arm["matmul_isa"] == "baseline" and arm["bf16_matmul"] == "emulated"
    assert isa.parse_cpuinfo("")["flags"] == set()


def test_machine_info_records_this_machines_isa():
    """Every benchmark's results JSON ("machine") carries the ISA of the machine it ran on."""
    recorded = report.machine_info()["isa"]
    assert recorded == isa.isa_info()
    flags = set()
    if os.path.exists("/proc/cpuinfo"):
        flags = isa.parse_cpuinfo(pathlib.Path("/proc/cpuinfo").read_text())["flags"]
    assert recorded["flags"] == {flag: flag in flags for flag in isa.MATMUL_FLAGS}


def _results(fp32, bf16, steps=(100, 200, 300, 400), exit_code=0):
    def run(values, precision):
        return {"precision": precision, "seed": 1, "segments": [{"exit_code": exit_code}],
                "timed_intervals": [0.4 if precision == "float32" else 0.25],
                "curves": {"mlm_loss": {"steps": list(steps), "values": list(values)}}}
    return {"settings": {"steps": steps[-1]},
            "runs": {"float32": run(fp32, "float32"), "bfloat16": run(bf16, "bfloat16")}}


def test_compare_applies_the_tolerance():
    fp32 = [9.0, 8.0, 7.0, 6.0]
    close = bf16_curve_report.compare(_results(fp32, [9.1, 8.1, 7.05, 6.05]), 0.02, 200)
    assert close["holds"] and close["verdict"].startswith("HOLDS")
    assert close["relative_gap"] == pytest.approx((7.05 + 6.05) / 13.0 - 1.0)
    assert close["speedup"] == pytest.approx(1.6)
    far = bf16_curve_report.compare(_results(fp32, [9.0, 8.0, 7.3, 6.2]), 0.02, 200)
    assert not far["holds"] and far["verdict"].startswith("FAILS")
    nan = bf16_curve_report.compare(_results(fp32, [9.0, 8.0, math.nan, 6.0]), 0.02, 200)
    assert not nan["holds"] and not nan["finite"]
    stopped = _results(fp32, fp32)
    curve = stopped["runs"]["bfloat16"]["curves"]["mlm_loss"]
    curve["steps"], curve["values"] = curve["steps"][:3], curve["values"][:3]  # stopped early
    short = bf16_curve_report.compare(stopped, 0.02, 200)
    assert not short["complete"] and not short["holds"]
    assert not bf16_curve_report.compare(_results(fp32, fp32, exit_code=1), 0.02, 200)["holds"]


@pytest.mark.slow  # the benchmark end to end in a subprocess, as the other benchmarks' smokes
def test_smoke_run_writes_both_curves_and_the_isa(tmp_path, pretraining_data, bfloat16_required):
    output, plot = tmp_path / "out" / "curve.json", tmp_path / "out" / "curve.png"
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "bench" / "bf16_curve.py"), "--smoke",
         f"--output={output}", f"--plot={plot}", f"--log={tmp_path / 'log.txt'}",
         f"--train_data={pretraining_data['static_train']}",
         f"--vocab={pretraining_data['vocab_file']}"],
        capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, (done.stderr[-3000:],
                                  (tmp_path / "log.txt").read_text()[-3000:])
    results = json.loads(output.read_text())
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(os.listdir(output.parent)) == ["curve.json", "curve.png"]  # no leftovers
    runs = results["runs"]
    assert {runs["float32"]["precision"], runs["bfloat16"]["precision"]} == {"float32",
                                                                             "bfloat16"}
    steps = results["settings"]["steps"]
    curves = {name: runs[name]["curves"]["mlm_loss"] for name in ("float32", "bfloat16")}
    for curve in curves.values():
        assert curve["steps"][-1] == steps and len(curve["steps"]) >= 2
        assert all(math.isfinite(v) and 0 < v < 20 for v in curve["values"])
    # bfloat16 really ran (not bit-identical to float32) and stays close on a 2-step curve.
    assert curves["float32"]["values"] != curves["bfloat16"]["values"]
    for a, b in zip(curves["float32"]["values"], curves["bfloat16"]["values"], strict=True):
        assert b == pytest.approx(a, rel=0.02)
    comparison = results["comparison"]
    assert comparison["complete"] and comparison["finite"]
    assert comparison["step_time_s"]["float32"] > 0 and comparison["step_time_s"]["bfloat16"] > 0
    assert results["machine"]["isa"] == isa.isa_info()
    assert "ISA: " in done.stdout and "| step |" in done.stdout


def test_benchmark_table_header_names_the_isa():
    """scripts/benchmark.py's markdown header says what the rows ran on (older results: not)."""
    results = json.loads((SCRIPTS.parent / "benchmarks" / "results.json").read_text())
    results["machine"].pop("isa", None)
    assert "ISA:" not in report.markdown(results).splitlines()[0]
    results["machine"]["isa"] = isa.isa_info(SAPPHIRE_RAPIDS, environ={})
    header = report.markdown(results).splitlines()[0]
    assert "ISA: Intel(R) Xeon(R) Platinum 8488C" in header and "bf16 matmul: amx" in header
