"""Shared LVM command layer: argv validation, command execution and JSON report parsing."""
