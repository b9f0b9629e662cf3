"""`python -m cli`: the raftbroker command without the console script."""

from cli.main import app

app(prog_name="raftbroker")
