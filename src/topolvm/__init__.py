"""TopoLVM in Python."""

import os

# The daemons serve gRPC with grpclib (rpc/transport.py) and never load grpcio; the tests and
# benchmarks use grpcio's clients. grpcio's fork handlers (pthread_atfork) serve processes that
# fork and go on using gRPC. Ours fork only to exec a command (LVM, mount, mkfs; the test bed's
# children), and there those handlers can crash the forking process while its other threads are
# inside gRPC (grpc/grpc#29044; seen once as a segfault of the test session). Off unless the
# environment asks for them.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
