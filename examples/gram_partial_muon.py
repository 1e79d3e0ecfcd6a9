"""``--impl examples.gram_partial_muon:gram_partial_muon`` from a checkout. The example lives in
the package, ``gates/examples/gram_partial_muon.py`` (the layout gates run it), which an
installed muongate names ``gates.examples.gram_partial_muon:gram_partial_muon``."""

from gates.examples.gram_partial_muon import (
    GramPartialMuon,
    LocalGramMuon,
    gram_partial_local_gram_muon,
    gram_partial_muon,
    partial_gram_ns,
)

__all__ = ["GramPartialMuon", "LocalGramMuon", "gram_partial_local_gram_muon", "gram_partial_muon", "partial_gram_ns"]
