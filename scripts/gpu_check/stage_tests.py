"""Stage 2: the tests that skip without CUDA (``-m gpu``), run where a GPU is; on ``--cpu`` they must
all skip cleanly (the marker and the skip conditions are what is checked)."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import result
from result import Check, at_least

ROOT = Path(__file__).resolve().parents[2]
FILES = ("tests/shim/test_state_cache.py", "tests/shim/test_state_cache_paths.py",
         "tests/demo/tiny_grpo/test_tiny_grpo.py",
         "tests/sync_plugin/test_sync_gpu.py")


def main() -> int:
    args = result.parse(__doc__.split("\n\n")[0])
    xml = args.out.with_suffix(".junit.xml")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                           f"--junitxml={xml}", *FILES], cwd=ROOT)
    if not xml.exists():
        return result.write(args.out, ok=False, figures={"exit": proc.returncode}, notes=["pytest did not run"])
    suite = ET.parse(xml).getroot()
    suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
    assert suite is not None
    count = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    fig = {"passed": count["tests"] - count["failures"] - count["errors"] - count["skipped"],
           "skipped": count["skipped"], "failed": count["failures"] + count["errors"]}
    checks = [Check("no GPU test failed", fig["failed"], "== 0", fig["failed"] == 0 and proc.returncode in (0, 5)),
              at_least("GPU tests passed", fig["passed"], 1, judged=not args.cpu)]
    if args.cpu:
        checks.append(Check("every GPU test skipped cleanly without CUDA", fig["passed"], "== 0", fig["passed"] == 0))
    notes = [] if proc.returncode in (0, 5) else [f"pytest exit {proc.returncode}; see the log"]
    return result.write(args.out, figures=fig, notes=notes, checks=checks)


if __name__ == "__main__":
    raise SystemExit(main())
