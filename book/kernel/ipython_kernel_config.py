"""IPython kernel settings for the kernels of this project's venv (``make setup`` installs this file
as ``.venv/etc/ipython/ipython_kernel_config.py``, a folder every IPython kernel of the venv reads).

Raw ``papermill`` (and nbclient, nbconvert) start kernels over TCP without the CurveZMQ keys that
``python -m attnlib run`` and ``make lab`` provision (jupyter_client ``transport_encryption="auto"``),
and ipykernel then logs "Kernel is running over TCP without encryption" on every run. papermill
reads no Jupyter config file, so the encryption cannot be switched on for it from here: this file
only keeps that one message out of the kernel's log (on 127.0.0.1, the project's only use); every
other kernel message is left as it is. Use ``python -m attnlib run`` for an encrypted kernel.
"""

import logging


class _WithoutTcpEncryptionWarning(logging.Filter):
    """Drops ipykernel's "running over TCP without encryption" warning, nothing else."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "running over TCP without encryption" not in record.getMessage()


c = get_config()  # noqa: F821 (defined by IPython when it loads a config file)
c.IPKernelApp.logging_config = {
    "filters": {"without_tcp_encryption_warning": {"()": _WithoutTcpEncryptionWarning}},
    "handlers": {"console": {"filters": ["without_tcp_encryption_warning"]}},
}
