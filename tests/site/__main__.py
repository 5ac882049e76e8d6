"""``python -m tests.site``: serve the test site in a process of its own.

A ``__main__`` of the package rather than ``python -m tests.site.server``:
running a module that the package's ``__init__`` has already imported would
load it twice, as ``__main__`` and as ``tests.site.server``.
"""

import sys

from tests.site.server import main

sys.exit(main())
