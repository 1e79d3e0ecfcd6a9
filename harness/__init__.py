"""The harness: rank pool, cases and strategies, tensor construction, comparison, the pytest plugin."""
