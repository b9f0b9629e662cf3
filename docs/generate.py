"""docs/design.md's generated parts, written from the code: the module map and the error table.

Each part sits between `<!-- generated: NAME -->` and `<!-- end: NAME -->` in design.md:

- `modules DIR`: a table of every module under DIR (a package, or the top level of one) with
  its role, the first paragraph of its docstring; a subdirectory with a part of its own is left
  to that part. A module's docstring is where its role is written, once.
- `errors`: every error class with a Kafka code (`RaftbrokerError` and its public subclasses),
  where it is defined, what it is a kind of, and its docstring.

`python docs/generate.py` (`make docs`) rewrites the parts in place; `--check` exits 1 when
design.md differs from what it would write (tests/unit/test_design_doc.py runs the same check).
Read with `ast`: nothing is imported, so the map is written whatever a module needs to import.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / "docs" / "design.md"
PART = re.compile(r"(<!-- generated: (.+?) -->\n)(.*?)(<!-- end: \2 -->)", re.S)
ERROR_ROOT = "RaftbrokerError"
ERROR_PACKAGES = ("statemachine", "cluster", "cli", "pipeline")


def first_paragraph(text: str) -> str:
    return " ".join(text.split("\n\n", maxsplit=1)[0].split())


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def docstring(path: Path) -> str | None:
    return ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))


def module_table(directory: str, parts: set[str], root: Path = ROOT) -> str:
    """The rows of every module under `directory` outside the parts of its subdirectories."""
    base = root / directory
    own = sorted(base.rglob("*.py"), key=lambda p: (p.parent != base, p.as_posix()))
    rows = ["| module | role |", "| --- | --- |"]
    for path in own:
        relative = path.relative_to(root).as_posix()
        if any(relative.startswith(f"{part}/") for part in parts if len(part) > len(directory)):
            continue
        text = docstring(path)
        if text is None:
            # Only an empty __init__.py may go without: a module opens with its role.
            assert path.name == "__init__.py", f"{relative} has no docstring"
            assert not path.read_text().strip(), f"{relative} has no docstring"
            continue
        name = path.relative_to(base).as_posix()
        rows.append(f"| `{name}` | {cell(first_paragraph(text))} |")
    return "\n".join(rows) + "\n"


def error_table() -> str:
    """Every public error class with a Kafka code, base classes first."""
    found: dict[str, tuple[str, str, str]] = {}  # name -> (module path, base, docstring)
    for package in ERROR_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                    bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
                    doc = ast.get_docstring(node) or ""
                    relative = path.relative_to(ROOT).as_posix()
                    found[node.name] = (relative, bases[0] if bases else "", doc)
    order = [ERROR_ROOT]
    for name in order:  # breadth first: each class after the one it is a kind of
        order.extend(sorted(n for n, (_, base, _) in found.items() if base == name))
    rows = ["| type | where | a kind of | what |", "| --- | --- | --- | --- |"]
    for name in order[1:]:
        where, base, doc = found[name]
        assert doc, f"{name} ({where}) has no docstring"
        rows.append(f"| `{name}` | `{where}` | `{base}` | {cell(' '.join(doc.split()))} |")
    return "\n".join(rows) + "\n"


def generated(text: str) -> str:
    """design.md's text with every generated part written afresh."""
    parts = {m.group(2).removeprefix("modules ") for m in PART.finditer(text)}

    def write(match: re.Match[str]) -> str:
        name = match.group(2)
        if name == "errors":
            body = error_table()
        elif name.startswith("modules "):
            body = module_table(name.removeprefix("modules "), parts)
        else:
            raise ValueError(f"docs/design.md: unknown generated part {name!r}")
        return f"{match.group(1)}{body}{match.group(4)}"

    return PART.sub(write, text)


def main(argv: list[str]) -> int:
    text = DESIGN.read_text(encoding="utf-8")
    fresh = generated(text)
    if "--check" in argv:
        if fresh != text:
            print("docs/design.md differs from the code: run `python docs/generate.py`")
            return 1
        return 0
    DESIGN.write_text(fresh, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
