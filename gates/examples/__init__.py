"""The example candidates and kernels that the gates themselves run, so that an installed
muongate has them: ``gathered_muon`` and ``gram_partial_muon`` (the layout gates' calibrated
``gram_partial`` tier), ``polar_express_kernel`` (the kernel gates' subject without
``--kernel``) and ``broken_kernel`` (their negative control).

The repository's ``examples/`` keeps modules of the same names that import these, so that
``--impl examples.gathered_muon:gathered_muon`` and the like still work from a checkout.
"""
