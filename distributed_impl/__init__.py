"""Sharded Muon on FSDP2/DTensor parameters: gather, orthogonalize with the reference's function, scatter."""

from distributed_impl.muon import ShardedMuon

__all__ = ["ShardedMuon"]
