"""The claims: pytest tests marked ``gate``, their negative controls and edge cases."""
