"""lvmd: gRPC service that manages logical volumes of one node's volume groups."""
