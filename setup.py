"""Build hook of the `satchel` distribution (everything else is in pyproject.toml): the contract's
`.proto` files ship in the wheel beside their stubs, as `satchel/v1/*.proto`."""

import warnings
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.warnings import InformationOnly

PROTOS = Path("proto", "satchel", "v1")


class BuildPyWithProtos(build_py):
    """`build_py`, then `proto/satchel/v1/*.proto` into the built `satchel/v1/`."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:  # an editable install reads proto/ in place
            return
        for proto in sorted(PROTOS.glob("*.proto")):
            self.copy_file(str(proto), str(Path(self.build_lib, "satchel", "v1", proto.name)))


# An editable install (scripts/setup) maps `satchel.client`, `satchel.server` and
# `satchel.migrations` onto client/, server/ and migrations/ (`[tool.setuptools.package-dir]`)
# through an import finder, and setuptools reports that with a notice that is not a problem, only
# a reminder ("Editable installation. Please be careful with folders in your working directory
# with the same name as your package"): pip prints it as a 10-line warning on every install.
warnings.filterwarnings("ignore", "Editable installation", InformationOnly)

setup(cmdclass={"build_py": BuildPyWithProtos})
