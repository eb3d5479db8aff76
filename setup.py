"""Build hook of the `satchel` distribution (everything else is in pyproject.toml): the contract's
`.proto` files ship in the wheel beside their stubs, as `satchel/v1/*.proto`."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PROTOS = Path("proto", "satchel", "v1")


class BuildPyWithProtos(build_py):
    """`build_py`, then `proto/satchel/v1/*.proto` into the built `satchel/v1/`."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:  # an editable install reads proto/ in place
            return
        for proto in sorted(PROTOS.glob("*.proto")):
            self.copy_file(str(proto), str(Path(self.build_lib, "satchel", "v1", proto.name)))


setup(cmdclass={"build_py": BuildPyWithProtos})
