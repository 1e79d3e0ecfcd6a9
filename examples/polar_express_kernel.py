"""``--kernel examples.polar_express_kernel:polar_express`` from a checkout. The kernel lives in
the package, ``gates/examples/polar_express_kernel.py`` (the kernel gates' subject without
``--kernel``), which an installed muongate names ``gates.examples.polar_express_kernel:polar_express``."""

from gates.examples.polar_express_kernel import polar_express

__all__ = ["polar_express"]
