"""Sharded Muon and NorMuon on FSDP2/DTensor parameters: gather, orthogonalize with the reference's
function, scatter."""

from distributed_impl.muon import ShardedMuon
from distributed_impl.normuon import ShardedNorMuon

__all__ = ["ShardedMuon", "ShardedNorMuon"]
