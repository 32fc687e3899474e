"""Live triage: pass a running job's output through unchanged and diagnose it as it goes.

Input: a byte stream (``watch``: standard input) or a command's stdout and stderr (``run``).
Output: every byte, unchanged and at once, on the same descriptor it would have gone to; and
diagnoses (the reports of :mod:`nccl_triage.render.report`) on stderr or in a report file, as soon as
the evidence is in, updated when the picture changes, and once more at the end.

Two processes, so that pass-through never depends on parsing:

* the **pump** (the command's own process) only copies bytes with ``os.read``/``os.write`` on
  the raw descriptors, and hands a copy to the analyser through a non-blocking pipe with a
  bounded backlog. When the analyser falls behind, the *oldest* unsent bytes are dropped (the
  newest matter most to a live diagnosis) and the analyser is told how many bytes and lines it
  missed, so line numbers stay right and the report says what was skipped. Output never waits
  for the analyser.
* the **analyser** (a child process, niced, ignoring Ctrl-C) runs the same pipeline as
  ``triage``: an incremental candidate scan (:class:`~nccl_triage.ingest.scan.Scanner`), the grammar and signals
  (:class:`nccl_triage.pipeline.Triage`), and :class:`LiveTriage` deciding when to report.

A thread would not do for the analyser: parsing holds the GIL, and a pump waiting up to the
interpreter's switch interval (5 ms) for it twice per 64 KiB read copies a few MB/s at best.

Memory is bounded: the backlog is capped, the scanner keeps a few lines and at most a window of
an endless line, signal events older than the largest rule window are pruned (except near a
failure, so a diagnosis does not fade), and the grammar's events are deduplicated.
"""
