"""``--kernel examples.broken_kernel:row_norm_ns`` from a checkout. The kernel lives in the
package, ``gates/examples/broken_kernel.py`` (the kernel gates' negative control), which an
installed muongate names ``gates.examples.broken_kernel:row_norm_ns``."""

from gates.examples.broken_kernel import row_norm_ns

__all__ = ["row_norm_ns"]
