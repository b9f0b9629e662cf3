"""The documentation: design.md, semantics.md, and generate.py, which writes design.md's parts
drawn from the code."""
