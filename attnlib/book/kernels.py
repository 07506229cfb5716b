"""Warm kernels: one Jupyter kernel per worker process, reused by the notebooks it executes.

papermill starts a kernel per notebook, and every page then imports numpy, scipy, matplotlib,
cvxpy and attnlib again: about 3 s per page before its first computation, a fifth of the book's
serial time and more of a robustness point's. :func:`acquire` hands out a kernel kept alive in this
process instead, reset between notebooks to the state it had after start-up
(:mod:`attnlib.book.kernel_state`): empty namespace, no figure open, the start-up rcParams, warnings,
numpy options, working directory and execution counter. Modules stay imported, which is the point.

A kernel is reused only when nothing that shapes it has changed: the kernel name, the working
directory and the environment it was started with (a mutant, ``ATTNLIB_EXPLORERS``, ``MPLBACKEND``
each get a kernel of their own). It is shut down, never reused, after a run that raised, timed out or
left the kernel dead (:func:`discard`), and when the process exits. ``ATTNLIB_FRESH_KERNELS=1``
starts a kernel per notebook, as papermill does by default.

:class:`Engine` is the papermill engine every attnlib run uses: papermill's nbclient engine, plus
the reuse of a kernel it was given (its client is closed after the run, the kernel left running), an
optional line on stderr per finished cell (``progress=True``), and cells left unexecuted by tag
(``skip_tags``: a checks-only run skips the cells tagged ``figure``, which only draw).

This module imports papermill and jupyter_client; :mod:`attnlib.book.run` imports it only when a
notebook is executed, so attnlib imports without Jupyter.
"""

from __future__ import annotations

import ast
import atexit
import hashlib
import os
import sys
import time
from multiprocessing import util as mp_util
from queue import Empty

from jupyter_client.blocking import BlockingKernelClient
from jupyter_client.manager import KernelManager
from papermill.clientwrap import PapermillNotebookClient
from papermill.engines import NBClientEngine, NotebookExecutionManager, papermill_engines
from papermill.log import logger as papermill_logger
from papermill.utils import merge_kwargs, remove_args

__all__ = [
    "ENGINE",
    "FRESH_KERNELS_ENV",
    "FIGURE_TAG",
    "Engine",
    "ReadyClient",
    "acquire",
    "discard",
    "figure_cell_problems",
    "shutdown_all",
    "warm_enabled",
]

ENGINE = "attnlib"
FRESH_KERNELS_ENV = "ATTNLIB_FRESH_KERNELS"
FIGURE_TAG = "figure"  # a cell that only draws: a checks-only run leaves it out
STARTUP_TIMEOUT_S = 60
#: How long :class:`ReadyClient` listens for IOPub messages still in flight (jupyter_client: 0.2 s).
IOPUB_DRAIN_S = 0.01
# Run silently in the kernel; they bind no name in the notebook's namespace.
_SAVE = '__import__("attnlib.book.kernel_state", fromlist=["save"]).save()'
_RESTORE = '__import__("attnlib.book.kernel_state", fromlist=["restore"]).restore()'

_kernels: dict[str, KernelManager] = {}
_used: set[str] = set()  # keys of kernels that already ran a notebook (they need a reset first)


def warm_enabled() -> bool:
    """False when ``ATTNLIB_FRESH_KERNELS`` asks for a kernel per notebook."""
    return os.environ.get(FRESH_KERNELS_ENV, "").strip().lower() not in ("1", "true", "yes")


def _key(kernel_name: str, cwd: str) -> str:
    environment = "\0".join(f"{k}={v}" for k, v in sorted(os.environ.items()))
    return hashlib.sha256(f"{kernel_name}\0{cwd}\0{environment}".encode()).hexdigest()


class ReadyClient(BlockingKernelClient):
    """The client of every kept kernel: jupyter_client's blocking client with a faster ``wait_for_ready``.

    Ready means the same as there: a ``kernel_info_reply`` on the shell channel, then one IOPub
    message (which proves IOPub connected; else ask again). jupyter_client then listens to IOPub
    until 0.2 s pass without a message, and every notebook pays that twice (the reset, then
    papermill's client): a fifth of a second per notebook, a tenth of a short chapter. Here the
    listening stops after :data:`IOPUB_DRAIN_S` of silence. A message still in flight after that is
    the kernel_info's own status; nbclient, like :func:`_run_silently`, reads only the replies to
    its own requests and skips it.
    """

    def wait_for_ready(self, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (float("inf") if timeout is None else timeout)
        while True:
            self.kernel_info()
            try:
                reply = self.shell_channel.get_msg(timeout=1)
            except Empty:
                reply = None
            if reply is not None and reply["msg_type"] == "kernel_info_reply":
                try:
                    self.iopub_channel.get_msg(timeout=0.2)
                except Empty:
                    pass  # IOPub not connected yet: ask again
                else:
                    self._handle_kernel_info_reply(reply)
                    break
            if not self.is_alive():
                raise RuntimeError("Kernel died before replying to kernel_info")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Kernel didn't respond in {timeout:.0f} seconds")
        while True:
            try:
                self.iopub_channel.get_msg(timeout=IOPUB_DRAIN_S)
            except Empty:
                return


def _run_silently(km: KernelManager, code: str) -> None:
    """Execute ``code`` in the kernel without output or history; raise if it fails."""
    client = km.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=STARTUP_TIMEOUT_S)
        msg_id = client.execute(code, silent=True, store_history=False, allow_stdin=False)
        while True:
            reply = client.get_shell_msg(timeout=STARTUP_TIMEOUT_S)
            if reply["parent_header"].get("msg_id") == msg_id:
                break
        content = reply["content"]
        if content.get("status") != "ok":
            raise RuntimeError(f"kernel reset failed: {content.get('ename')}: {content.get('evalue')}")
    finally:
        client.stop_channels()


def _start(kernel_name: str, cwd: str, config) -> KernelManager:
    km = KernelManager(kernel_name=kernel_name, config=config)
    km.client_factory = ReadyClient  # km.client(): here and in papermill's client
    km.start_kernel(cwd=cwd)
    try:
        _run_silently(km, _SAVE)
    except BaseException:
        km.shutdown_kernel(now=True)
        raise
    return km


def acquire(kernel_name: str, cwd: str, config=None) -> KernelManager:
    """A running kernel for a notebook in ``cwd``, in the state of a fresh one.

    The kernel of an earlier notebook with the same name, directory and environment is reset and
    returned; otherwise (or if the reset fails) a new one is started and kept.
    """
    key = _key(kernel_name, cwd)
    km = _kernels.get(key)
    if km is not None:
        try:
            if not km.is_alive():
                raise RuntimeError("the kernel died")
            if key in _used:
                _run_silently(km, _RESTORE)
        except Exception:  # a kernel that cannot be reset is replaced, never used as it is
            discard(km)
            km = None
    if km is None:
        km = _kernels[key] = _start(kernel_name, cwd, config)
        _used.discard(key)
    _used.add(key)
    return km


def discard(km: KernelManager | None) -> None:
    """Shut a kernel down and forget it (after a run that failed: its state is unknown)."""
    if km is None:
        return
    for key, kept in list(_kernels.items()):
        if kept is km:
            del _kernels[key]
            _used.discard(key)
    try:
        km.shutdown_kernel(now=True)
    except Exception:  # already dead: nothing to stop
        pass


def shutdown_all() -> None:
    """Shut down every kept kernel (at exit, also in a pool's worker processes)."""
    for km in list(_kernels.values()):
        discard(km)


atexit.register(shutdown_all)
# A multiprocessing worker leaves through os._exit, which skips atexit; its finalizers do run.
mp_util.Finalize(None, shutdown_all, exitpriority=10)


def _names(tree: ast.AST) -> tuple[set[str], set[str]]:
    """The names a cell binds (assignments, defs, imports, loop targets) and the names it reads."""
    bound, read = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (bound if isinstance(node.ctx, (ast.Store, ast.Del)) else read).add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
    return bound, read


def figure_cell_problems(cells: list[dict]) -> list[str]:
    """Why a cell tagged :data:`FIGURE_TAG` could change what a checks-only run computes, if it could.

    ``cells``: a notebook's cells (``nbformat`` dicts). A figure cell may read anything; it must
    bind no name that a later cell reads before binding it itself (that cell would see another
    value, or none), and record no check (it mentions no ``checks``). What this cannot see: a
    figure cell that mutates an object a later cell reads (``rng.normal(...)`` on a shared
    generator, ``list.append``); the chapters' checks-only values are compared with and without
    the skip (``tests/book/test_kernels.py``).

    >>> cell = lambda source, *tags: {"cell_type": "code", "source": source, "metadata": {"tags": list(tags)}}
    >>> figure_cell_problems([cell("x = 1"), cell("fig = draw(x)", "figure"), cell("print(fig)")])
    ["cell 2 binds 'fig', which cell 3 reads"]
    """
    code = [(i, c) for i, c in enumerate(cells, 1) if c.get("cell_type") == "code"]
    parsed = {}
    for i, c in code:
        source = "".join(c["source"]) if isinstance(c["source"], list) else c["source"]
        # IPython magics and shell escapes are not Python: read as blank lines
        source = "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())
        parsed[i] = _names(ast.parse(source))
    problems = []
    for position, (i, c) in enumerate(code):
        if FIGURE_TAG not in c.get("metadata", {}).get("tags", []):
            continue
        bound, read = parsed[i]
        if "checks" in read or "checks" in bound:
            problems.append(f"cell {i} uses checks")
        for name in sorted(bound):
            for j, _ in code[position + 1 :]:
                later_bound, later_read = parsed[j]
                if name in later_bound:  # rebound there (``fig, ax = plt.subplots()``): what follows reads that
                    break
                if name in later_read:
                    problems.append(f"cell {i} binds {name!r}, which cell {j} reads")
                    break
    return problems


class _Manager(NotebookExecutionManager):
    """papermill's manager, writing the notebook once, when the run ends (also when it fails or times out).

    papermill writes the whole notebook, every output so far included, at the start and at the end of
    every cell: for a chapter of 40 code cells and 3 MB of figures that is 80 writes, about a tenth of
    its execution time. The run's own progress goes to stderr (:class:`_ProgressManager`), and a run
    writes its output atomically at the end anyway, so the intermediate copies serve nobody.
    """

    final = False  # set just before notebook_complete(): the one write

    def save(self, **kwargs):
        if self.final:
            super().save(**kwargs)


class _ProgressManager(_Manager):
    """papermill's manager, plus one line on stderr as each code cell finishes.

    papermill's own progress bar redraws one line (a tqdm bar); a rerun of a 10-minute chapter is
    easier to follow, and to log, as a line per cell: its number, its first line and its duration.
    """

    def cell_complete(self, cell, cell_index=None, **kwargs):
        super().cell_complete(cell, cell_index=cell_index, **kwargs)
        if cell.cell_type != "code":
            return
        code = [c for c in self.nb.cells if c.cell_type == "code"]
        number = next((i for i, c in enumerate(code, 1) if c is cell), 0)
        state = cell.metadata.papermill.get("status")
        duration = cell.metadata.papermill.get("duration") or 0.0
        elapsed = time.perf_counter() - self.started
        mark = "FAILED" if cell.metadata.papermill.get("exception") else ("done" if state else "")
        head = f"  cell {number}/{len(code)} {mark} in {duration:.1f} s (total {elapsed:.0f} s)"
        print(f"{head}: {_first_line(cell.source)}", file=sys.stderr, flush=True)


def _first_line(source: str) -> str:
    line = next((text.strip() for text in source.splitlines() if text.strip() and not text.startswith("#")), "")
    return line if len(line) <= 60 else line[:57] + "..."


class _Client(PapermillNotebookClient):
    """papermill's client, which leaves cells with a tag in ``skip_tags`` unexecuted and closes its
    channels to a kernel it was given (papermill would leave them open: the kernel is not its own)."""

    def __init__(self, nb_man, skip_tags=(), **kwargs):
        super().__init__(nb_man, **kwargs)
        self.skip_tags = frozenset(skip_tags)

    def execute_cell(self, cell, cell_index, *args, **kwargs):
        if self.skip_tags and self.skip_tags & set(cell.get("metadata", {}).get("tags", [])):
            cell.outputs, cell.execution_count = [], None
            return cell
        return super().execute_cell(cell, cell_index, *args, **kwargs)

    def execute(self, **kwargs):
        try:
            return super().execute(**kwargs)
        finally:
            if not self.owns_km and self.kc is not None:
                self.kc.stop_channels()
                self.kc = None


class Engine(NBClientEngine):
    """The engine of every attnlib run (registered as :data:`ENGINE`)."""

    @classmethod
    def execute_notebook(cls, nb, kernel_name, output_path=None, progress_bar=False, log_output=False,
                         autosave_cell_every=30, progress=False, **kwargs):  # fmt: skip
        manager_class = _ProgressManager if progress else _Manager
        manager = manager_class(
            nb, output_path=output_path, progress_bar=False, log_output=log_output,
            autosave_cell_every=autosave_cell_every,
        )  # fmt: skip
        manager.started = time.perf_counter()
        manager.notebook_start()
        try:
            cls.execute_managed_notebook(manager, kernel_name, log_output=log_output, **kwargs)
        finally:
            manager.cleanup_pbar()
            manager.final = True
            manager.notebook_complete()
        return manager.nb

    @classmethod
    def execute_managed_notebook(cls, nb_man, kernel_name, log_output=False, stdout_file=None, stderr_file=None,
                                 start_timeout=60, execution_timeout=None, **kwargs):  # fmt: skip
        # As papermill's NBClientEngine does, with attnlib's client.
        kwargs = remove_args(["input_path", "timeout", "startup_timeout"], **kwargs)
        final_kwargs = merge_kwargs(
            kwargs,
            timeout=execution_timeout,
            startup_timeout=start_timeout,
            kernel_name=kernel_name,
            log=papermill_logger,
            log_output=log_output,
            stdout_file=stdout_file,
            stderr_file=stderr_file,
        )
        return _Client(nb_man, **final_kwargs).execute()


if ENGINE not in papermill_engines._engines:
    papermill_engines.register(ENGINE, Engine)
