"""`make demo`'s own data and plots, kept out of the library (scripts/demo.py runs the demo).

- `corpus`: a pretraining corpus from the docstrings of Python's standard library.
- `task`: the fine-tuning task (which standard-library package a sentence comes from).
- `plotting`: loss curves read from TensorBoard event files, drawn as a PNG.

The library never imports this package.
"""
