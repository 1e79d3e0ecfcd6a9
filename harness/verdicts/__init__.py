"""Where a verdict is decided: comparing raw bits and named tiers (``compare``), the four
outcomes and what a rank's failure was (``outcomes``), the declared causes of a difference and
their calibrated tiers (``causes``), and what a test kept of a candidate's parameters (``kept``)."""
