"""Everything that does I/O: Raft groups, storage, the wire, the server, the client."""
