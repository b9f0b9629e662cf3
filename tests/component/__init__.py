"""Component tests: real parts of a node (the segment store, a replica, a Raft group, the
server, the client connection, the data directory) in this process, on real files and loopback
sockets, without node processes."""
