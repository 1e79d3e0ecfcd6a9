"""What the plug-in costs another project's pytest session: wall time of a one-test session
with ``-p harness.plugin`` against ``-p no:harness.plugin``, interleaved so that load elsewhere
hits both.

    python -m benchmarks.plugin_startup [--runs 10]

Prints each side's median and best and the difference (``tests/test_plugin.py`` holds what it
imports; this is how long that takes).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.plugin_startup", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as project:
        Path(project, "test_unrelated.py").write_text("def test_unrelated():\n    assert True\n", encoding="utf-8")
        times: dict[str, list[float]] = {"harness.plugin": [], "no:harness.plugin": []}
        for _ in range(args.runs):
            for plugin, runs in times.items():
                start = time.perf_counter()
                command = [sys.executable, "-m", "pytest", "-q", "-p", plugin, "-p", "no:cacheprovider"]
                subprocess.run(command, cwd=project, check=True, capture_output=True)
                runs.append(time.perf_counter() - start)
    for plugin, runs in times.items():
        print(f"-p {plugin:18} median {statistics.median(runs):.2f} s, best {min(runs):.2f} s ({len(runs)} runs)")
    with_plugin, without = (statistics.median(times[p]) for p in times)
    print(f"the plug-in costs {with_plugin - without:+.2f} s a session (medians; {with_plugin / without:.2f}×)")


if __name__ == "__main__":
    main()
