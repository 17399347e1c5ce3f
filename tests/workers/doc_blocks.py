"""Runs the documentation's Python blocks listed in a JSON file (``tests/test_docs.py`` writes it), in order, each
in its own fresh globals, with its line numbers those of its Markdown file. On the first failure it prints which
block failed (file and line) with the traceback and exits 1, so mpirun ends the job on every rank."""

from __future__ import annotations

import json
import os
import sys
import traceback


def main() -> None:
    with open(sys.argv[2]) as f:
        blocks = json.load(f)
    for i, block in enumerate(blocks):
        where = f"{block['file']}:{block['line']}"
        # Blank lines before the code keep a traceback's line numbers those of the Markdown file.
        source = "\n" * block["line"] + block["code"]
        try:
            exec(compile(source, block["file"], "exec"), {"__name__": "__main__"})
        except BaseException:
            print(f"doc block failed: {where} (block {i + 1} of {len(blocks)})", flush=True)
            traceback.print_exc()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)
        print(f"doc block ran: {where}", flush=True)


if __name__ == "__main__":
    main()
