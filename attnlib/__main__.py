"""``python -m attnlib COMMAND``: ``run`` one parameterised notebook, ``sweep`` a grid, build the ``book``."""

import sys

USAGE = """usage: python -m attnlib {run,sweep,robustness,book,pdf} ...

commands:
  run    execute a notebook with parameters changed:  run NOTEBOOK -p NAME VALUE ... -o OUT.ipynb
  sweep  execute a notebook over a grid of parameters:  sweep NOTEBOOK --grid NAME=V1,V2 ... --jobs N
  robustness  sweep every theorem chapter over fresh seeds into book/robustness/:  robustness --seeds A:B
  book   execute the book's notebooks (only those that changed) and build the site in _build/html
  pdf    print the built book as one PDF, _build/pdf/attnlib-book.pdf (after `book`; needs Chromium)

python -m attnlib COMMAND --help describes each command."""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    # Each command's module is imported only when asked for (papermill stays lazy in all of them).
    if command == "run":
        from .book.run import main as command_main
    elif command == "sweep":
        from .book.sweep import main as command_main
    elif command == "robustness":
        from .book.robustness import main as command_main
    elif command == "book":
        from .book.build import main as command_main
    elif command == "pdf":
        from .book.pdf import main as command_main
    else:
        print(f"error: unknown command {command!r}\n\n{USAGE}", file=sys.stderr)
        return 2
    return command_main(rest)


if __name__ == "__main__":
    sys.exit(main())
