"""Reports and advice to text; only this package imports jinja2.

:mod:`~nccl_triage.render.advice` renders the sandboxed advice templates,
:mod:`~nccl_triage.render.report` the text, Markdown and JSON reports, and
:mod:`~nccl_triage.render.html` the batch page.
"""
