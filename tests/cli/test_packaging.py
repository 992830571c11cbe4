"""The wheel's package list is written by hand in pyproject.toml (the folders install as
radixtop.*): a package folder left out of it would be left out of the wheel, and only an
editable install would hide that. Every folder with an __init__.py under the four roots is listed."""

from __future__ import annotations

import tomllib

from tests.support import REPO

ROOTS = {"cli": "radixtop.cli", "inspector": "radixtop.inspector", "adapters": "radixtop.adapters",
         "gpu_backend": "radixtop.gpu_backend"}


def test_every_package_folder_is_in_the_wheels_package_list():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"] == {package: folder for folder, package in ROOTS.items()}
    folders = {
        ".".join([ROOTS[root], *init.parent.relative_to(REPO / root).parts])
        for root in ROOTS for init in (REPO / root).rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    assert folders == set(config["packages"]), folders ^ set(config["packages"])
