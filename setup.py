"""Package list for setuptools (everything else is in pyproject.toml).

The repo keeps the shipped Switchyard deployments at the top level (`profiles/`), where the design
card puts them; the wheel installs them as the package `server.profiles`, which the server reads
through importlib.resources, so an installed (non-editable) server finds them too. Its folders (the
NeMo Gym server directory), like the viewer's static files, hold data, not code, but Python would
import them as namespace packages, so they are listed as packages too: setuptools then ships their
files without warning that a package "would be ignored".
"""

from setuptools import find_namespace_packages, find_packages, setup

PROFILE_FOLDERS = [f"server.profiles.{name}" for name in find_namespace_packages(where="profiles")]

setup(
    packages=[
        *find_packages(include=["server", "server.*", "middleware", "middleware.*"]),
        "server.profiles",
        *PROFILE_FOLDERS,
        "server.viewer.static",
    ],
    package_dir={"server.profiles": "profiles"},
    package_data={
        "server.profiles": ["*.toml", "*.yaml"],
        **{folder: ["*"] for folder in PROFILE_FOLDERS},
        "server.viewer.static": ["*"],
    },
)
