"""Causal language modelling (GPT-style): next-token pretraining, generation and its export."""
