"""Raw papermill is quiet: the venv's kernel config keeps ipykernel's TCP warning out of the log.

``make setup`` installs ``book/kernel/ipython_kernel_config.py`` into ``.venv/etc/ipython/``; here the
same file is given to a kernel through a temporary ``IPYTHONDIR`` profile (the same loader), and a
one-cell notebook is run with raw ``papermill``. Control: the kernel without the file warns.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "book" / "kernel" / "ipython_kernel_config.py"
INSTALLED = Path(sys.prefix) / "etc" / "ipython" / "ipython_kernel_config.py"
WARNING = "running over TCP without encryption"


def _raw_papermill(tmp_path: Path, ipython_dir: Path) -> subprocess.CompletedProcess:
    cell = {"cell_type": "code", "execution_count": None, "id": "one", "metadata": {}, "outputs": [], "source": "1"}
    kernelspec = {"name": "python3", "display_name": "Python 3", "language": "python"}
    notebook = {"cells": [cell], "metadata": {"kernelspec": kernelspec}, "nbformat": 4, "nbformat_minor": 5}
    source = tmp_path / "one.ipynb"
    source.write_text(json.dumps(notebook))
    env = {**os.environ, "IPYTHONDIR": str(ipython_dir)}
    command = [sys.executable, "-m", "papermill", str(source), str(tmp_path / "out.ipynb")]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300, check=True)


def test_setup_installs_the_kernel_config_into_the_venv():
    makefile = (ROOT / "Makefile").read_text()
    assert "KERNEL_CONFIG := $(VENV)/etc/ipython/ipython_kernel_config.py" in makefile
    assert "$(KERNEL_CONFIG): book/kernel/ipython_kernel_config.py" in makefile
    assert "setup: $(STAMP) $(KERNEL_CONFIG)" in makefile
    if INSTALLED.exists():
        assert INSTALLED.read_text() == CONFIG.read_text(), f"{INSTALLED} is stale: run `make setup`"


def test_raw_papermill_runs_without_the_tcp_warning(tmp_path):
    pytest.importorskip("papermill")
    quiet = tmp_path / "quiet"
    (quiet / "profile_default").mkdir(parents=True)
    shutil.copy(CONFIG, quiet / "profile_default" / "ipython_kernel_config.py")
    assert WARNING not in _raw_papermill(tmp_path, quiet).stderr
    if INSTALLED.exists():
        pytest.skip("the control needs a venv without the installed kernel config")
    plain = tmp_path / "plain"
    plain.mkdir()
    assert WARNING in _raw_papermill(tmp_path, plain).stderr, "control: a kernel without the config warns"
