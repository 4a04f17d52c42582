"""Configuration models shared by the components."""
