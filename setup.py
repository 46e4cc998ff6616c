"""Build script; the metadata lives in setup.cfg. Adds the `all` extra: every user-facing extra."""
import configparser
from pathlib import Path

from setuptools import setup

USER_EXTRAS = ("spark", "mpi", "plot", "lightning", "tensorflow", "ray")


def _extras() -> dict:
    config = configparser.ConfigParser()
    config.read(Path(__file__).with_name("setup.cfg"))
    section = config["options.extras_require"]
    extras = {name: [line.strip() for line in section[name].splitlines()
                     if line.strip() and not line.strip().startswith("#")] for name in section}
    extras["all"] = sorted({req for name in USER_EXTRAS for req in extras[name]})
    return extras


setup(extras_require=_extras())
