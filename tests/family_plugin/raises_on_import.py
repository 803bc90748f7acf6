"""A plugin family module whose own code fails on import (the bad-input sweep's case): bert-train
names the module and the error's first line instead of printing a traceback."""

raise RuntimeError("the plugin's table is missing\nsecond line: never shown")
