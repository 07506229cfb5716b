"""What a benchmark result must carry about its machine and its moment: CPU model, cores, load.

Shared by ``run.py`` and ``side_by_side.py``. Standard library only (the side-by-side driver
imports nothing heavy, so that it does not compete with the runs it times).
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def utc_now() -> str:
    """The current time, UTC, to the second: ``YYYY-MM-DD HH:MM:SS``."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")


def load() -> dict:
    """The load averages now (1, 5, 15 min) and the ``uptime`` line that shows them."""
    try:
        line = subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        line = ""
    return dict(utc=utc_now(), load_average=[round(x, 2) for x in os.getloadavg()], uptime=line)


def machine() -> dict:
    """Node, CPU model, logical cores, Python version and the load now."""
    return dict(
        node=platform.node(),
        cpu=cpu_model(),
        cpus=os.cpu_count(),
        python=platform.python_version(),
        load_average=list(os.getloadavg()),
    )
