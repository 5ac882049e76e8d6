"""The test site's link graph, read from its pages' own HTML (not from its code)."""

from __future__ import annotations

import re
from typing import Any


def nav_links(site: Any, path: str) -> list[str]:
    """The paths a page links to in its ``<nav>``."""
    nav = re.search(rb"<nav>(.*?)</nav>", site.body(path), re.S)
    assert nav is not None, path
    return [href.decode() for href in re.findall(rb'href="([^"]+)"', nav.group(1))]


def nav_depths(site: Any, start: str) -> dict[str, int]:
    """Link depth of every page reached from *start*."""
    depths = {start: 0}
    queue = [start]
    while queue:
        path = queue.pop(0)
        for target in nav_links(site, path):
            if target not in depths:
                depths[target] = depths[path] + 1
                queue.append(target)
    return depths
