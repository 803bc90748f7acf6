"""The tagging task family."""
