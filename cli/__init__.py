"""The `raftbroker` command (typer): the only code that reads configuration files, builds a
node's configuration, configures logging and starts an event loop (uvloop where installed)."""
