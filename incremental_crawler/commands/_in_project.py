"""Project-only commands refuse to run outside a project, as Scrapy's do.

Scrapy leaves a command whose ``requires_project`` is true out of its
commands outside a project ("not available from this location"), but only
for those of its own and of ``COMMANDS_MODULE``: the ones of an entry point
(this package's) are there in any directory, where they would run on
Scrapy's default settings (``scrapy crawl`` looking for a spider no project
holds, ``scrapy state`` for a store in the current directory). Each
project-only command of the package mixes :class:`InProject` in first, and
refuses there with Scrapy's usage-error status.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from scrapy.exceptions import UsageError
from scrapy.utils.project import inside_project

if TYPE_CHECKING:
    import argparse

__all__ = ["InProject"]


class InProject:
    """Mixed into a project-only command (first): outside a project, a
    usage error (exit status 2)."""

    requires_project: bool

    def process_options(self, args: list[str], opts: argparse.Namespace) -> None:
        if self.requires_project and not inside_project():
            name = type(self).__module__.rsplit(".", 1)[-1]
            raise UsageError(f"scrapy {name} is only available from within a project "
                             "(a directory with a scrapy.cfg, or SCRAPY_SETTINGS_MODULE set)",
                             print_help=False)
        super().process_options(args, opts)  # type: ignore[misc]
