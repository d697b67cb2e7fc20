"""Build hooks only (the project is declared in pyproject.toml).

Both wheels (``pip install rollmux``) and editable installs (``pip install -e .``) put
``rollmux-roll.pth`` at the root of site-packages: the ROLL adapter's opt-in loader (ROLL has no
plugin entry point). The file is inert unless ``ROLLMUX_SIDECAR_SOCKET`` is set.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = Path(__file__).resolve().parent / "adapters" / "roll" / "rollmux-roll.pth"


class BuildPy(build_py):
    """build_py that also places the .pth at the wheel's root."""

    def run(self) -> None:
        super().run()
        if not self.editable_mode:
            self.copy_file(str(PTH), str(Path(self.build_lib) / PTH.name))


cmdclass: dict[str, type] = {"build_py": BuildPy}

try:
    from setuptools.command.editable_wheel import editable_wheel

    class EditableWheel(editable_wheel):
        """editable_wheel that adds the .pth next to setuptools' own editable finder."""

        def _run_build_commands(self, dist_name, unpacked_wheel, build_lib, tmp_dir):  # type: ignore[no-untyped-def]
            result = super()._run_build_commands(dist_name, unpacked_wheel, build_lib, tmp_dir)
            shutil.copy(PTH, Path(unpacked_wheel) / PTH.name)
            return result

    cmdclass["editable_wheel"] = EditableWheel
except ImportError:  # setuptools < 64 has no PEP 660 editable wheels
    pass

setup(cmdclass=cmdclass)
