"""TopoLVM in Python."""
