"""Training: turn table and statistics, algorithms, packing, losses, update plans, config, the loop."""
