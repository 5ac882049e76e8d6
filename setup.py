"""Kept for scrapyd-deploy only: everything is in pyproject.toml.

scrapyd-client 2.0 builds the egg it uploads with ``python setup.py
bdist_egg``; where there is no setup.py it writes a template of its own that
ships no package data (the Lua scripts would be missing from the egg).
This one lets setuptools read pyproject.toml, package data and entry points
included.
"""

from setuptools import setup

setup()
