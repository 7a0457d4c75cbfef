"""What the front ends share (the CLI, the server, eval, bench, tiny and the demo), below all of them.

Building a pipeline from command-line options (:mod:`.options`), the grammar of method variants
(:mod:`.variants`), a run's identity for ``--resume`` (:mod:`.identity`), append-safe JSONL (:mod:`.jsonl`),
``--help`` text from docstrings (:mod:`.help`), the wording of a gate decision (:mod:`.explain`) and a reader of
the server's ``/metrics`` text (:mod:`.prometheus`). None of the front ends imports another's command line.
"""
