"""The classification task family."""
