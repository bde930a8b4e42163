"""docs/python.md quotes the code between "# [name]" markers in the extension's example and
tests verbatim (dedented): the snippets it shows are code that runs."""

import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "examples" / "torch" / "moe_example.py", ROOT / "examples" / "torch" / "pipeline_example.py", *sorted((ROOT / "tests" / "python").glob("test_*.py"))]
MARKER = re.compile(r"^ *# \[([a-z_]+)\]$")


def snippets():
    for source in SOURCES:
        inside, lines = None, []
        for line in source.read_text().splitlines():
            m = MARKER.match(line)
            if m and inside is None:
                inside, lines = m.group(1), []
            elif m:
                yield source.name, inside, textwrap.dedent("\n".join(lines))
                inside = None
            elif inside is not None:
                lines.append(line)


def test_docs_python_md_quotes_the_snippets():
    doc = (ROOT / "docs" / "python.md").read_text()
    found = list(snippets())
    assert {name for _, name, _ in found} >= {"trainer_step", "hook", "pool_and_record", "views", "strict", "sized_step",
                                                "size_from_run", "guessed_plan", "pipeline", "mark"}
    missing = [f"{source}: [{name}]" for source, name, text in found if text not in doc]
    assert not missing, "docs/python.md does not quote: " + ", ".join(missing)
