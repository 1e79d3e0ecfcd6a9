"""Models the training gates train: a small MoE (the empty-expert deadlock) and a byte-level transformer."""
