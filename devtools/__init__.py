# first, before anything imports grpc: topolvm/__init__.py turns its fork handlers off
import topolvm  # noqa: F401
