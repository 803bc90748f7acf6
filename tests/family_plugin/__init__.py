"""A task family defined in the test suite, not in the package: the plugin proof."""
