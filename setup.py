"""Package list for setuptools (everything else is in pyproject.toml).

The repo keeps the shipped Switchyard deployments at the top level (`profiles/`), where the design
card puts them; the wheel installs them as the package `server.profiles`, which the server reads
through importlib.resources, so an installed (non-editable) server finds them too.
"""

from setuptools import find_packages, setup

setup(
    packages=[*find_packages(include=["server", "server.*", "middleware", "middleware.*"]), "server.profiles"],
    package_dir={"server.profiles": "profiles"},
)
