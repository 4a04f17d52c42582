import os

# before anything imports grpc: its fork handlers off, as src/topolvm/__init__.py explains
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
