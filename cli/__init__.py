"""raftbroker command-line interface (filled in by the CLI issue)."""
