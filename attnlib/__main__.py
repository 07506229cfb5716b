"""``python -m attnlib COMMAND``: ``run`` one parameterised notebook, ``sweep`` a grid, build the ``book``."""

import sys

from .book import build, lab, page, pdf, robustness, sweep

USAGE = """usage: python -m attnlib {run,sweep,robustness,book,pdf,lab} ...

commands:
  run    execute a notebook with parameters changed:  run NOTEBOOK -p NAME VALUE ... [-o OUT.ipynb] [--html]
         list its parameters, defaults, types and allowed values:  run NOTEBOOK --list-parameters
  sweep  execute a notebook over a grid of parameters:  sweep NOTEBOOK --grid NAME=V1,V2 ... --jobs N
  robustness  sweep every theorem chapter over fresh seeds into book/robustness/:  robustness --seeds A:B
  book   execute the book's notebooks (only those that changed) and build the site in _build/html
  pdf    print the built book as one PDF, _build/pdf/attnlib-book.pdf (after `book`; needs Chromium)
  lab    JupyterLab on working copies of the chapters in _build/lab (what `make lab` runs)

python -m attnlib COMMAND --help describes each command and its exit codes
(run: 0 ok, 1 claims failed, 2 refused, 3 invalid parameter, 4 error, 5 timeout)."""


COMMANDS = {
    "run": page.run_main,
    "sweep": sweep.main,
    "robustness": robustness.main,
    "book": build.main,
    "pdf": pdf.main,
    "lab": lab.main,
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:  # papermill stays lazy in every command's module
        print(f"error: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    return COMMANDS[command](rest)


if __name__ == "__main__":
    sys.exit(main())
