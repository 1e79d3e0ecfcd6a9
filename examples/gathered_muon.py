"""``--impl examples.gathered_muon:gathered_muon`` from a checkout. The example lives in the
package, ``gates/examples/gathered_muon.py`` (the layout gates build on it), which an installed
muongate names ``gates.examples.gathered_muon:gathered_muon``."""

from gates.examples.gathered_muon import (
    _DECLARED,
    GatheredMuon,
    GatheredMuonLocalLr,
    gathered_muon,
    gathered_muon_local_lr,
    plain_quintic,
)

__all__ = [
    "_DECLARED",
    "GatheredMuon",
    "GatheredMuonLocalLr",
    "gathered_muon",
    "gathered_muon_local_lr",
    "plain_quintic",
]
