"""The squad task family."""
