"""``python -m attnlib COMMAND``: ``run`` one parameterised notebook, ``sweep`` a grid, build the ``book``."""

import sys

from .book import build, robustness, run, sweep

USAGE = """usage: python -m attnlib {run,sweep,robustness,book} ...

commands:
  run    execute a notebook with parameters changed:  run NOTEBOOK -p NAME VALUE ... -o OUT.ipynb
  sweep  execute a notebook over a grid of parameters:  sweep NOTEBOOK --grid NAME=V1,V2 ... --jobs N
  robustness  sweep every theorem chapter over fresh seeds into book/robustness/:  robustness --seeds A:B
  book   execute the book's notebooks (only those that changed) and build the site in _build/html

python -m attnlib COMMAND --help describes each command."""


COMMANDS = {"run": run.main, "sweep": sweep.main, "robustness": robustness.main, "book": build.main}


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
