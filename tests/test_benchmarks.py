"""The benchmarks run (smoke test, speed never asserted) and the SVM fast path agrees with cvxpy."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def test_quick_benchmark_writes_every_section(tmp_path):
    out = tmp_path / "core.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/run.py"), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["quick"] is True
    for section in ("batching", "scaling", "svm", "memory", "local_converge"):
        assert section in result, section
    rows = result["batching"]["rows"]
    assert {r["blas_threads"] for r in rows} == {"default", "1"}
    assert all(np.isfinite(r["flop_fraction"]) and r["flop_fraction"] > 0 for r in rows)
    many = result["svm"]["many"]
    assert many["infeasible_agree"]
    assert many["nnls_max_relerr"] < 1e-6 and many["max_margin_max_relerr"] < 1e-6
    assert "NGD cost per trajectory-step" in proc.stdout
