"""``docs``: the project's reference documents, printed from the code that defines them.

Input: a document name. Output: Markdown (or JSON) on stdout, the same text as the file of
that name in the repository's ``docs/`` (a test keeps them equal), so an installed copy has
its contracts too.
"""

from __future__ import annotations

import click

DOCUMENTS = {
    "causes": "the root causes a diagnosis can name, with their rules (docs/causes.md)",
    "json-output": "the JSON report and the exit status (docs/json-output.md)",
    "log-formats": "NCCL's and PyTorch's log formats by era, real lines (docs/log-formats.md)",
    "rules": "the built-in rules and the rule file format (docs/rules.md)",
    "rule-schema": "the JSON Schema of rule and signal files (docs/rule-schema.json)",
}


@click.command()
@click.argument("name", type=click.Choice(sorted(DOCUMENTS)))
def docs(name: str) -> None:
    """Print a reference document: causes, json-output, log-formats, rules or rule-schema.

    \b
        causes       the root causes a diagnosis can name, with their rules
        json-output  the JSON report and the exit status (a public contract)
        log-formats  NCCL's and PyTorch's log lines by era, and what is read from them
        rules        the built-in rules and the rule file format
        rule-schema  the JSON Schema of rule and signal files
    """  # noqa: D301 - click's no-rewrap marker is the \b (backspace) character itself
    from nccl_triage.authoring.docs import causes_markdown, json_output_markdown, rules_markdown
    from nccl_triage.ruleset import load_ruleset

    if name == "causes":
        text = causes_markdown(load_ruleset())
    elif name == "json-output":
        text = json_output_markdown()
    elif name == "log-formats":
        from nccl_triage.authoring.formats import log_formats_markdown
        from nccl_triage.ruleset.formats import load_log_formats

        text = log_formats_markdown(load_log_formats())
    elif name == "rules":
        text = rules_markdown(load_ruleset())
    else:
        from nccl_triage.authoring import schema_json

        text = schema_json()
    click.echo(text, nl=False)
