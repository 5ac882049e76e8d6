"""The requests a page's callback yielded, kept to yield them again.

A 304 says a page is the same as last time, so its links are the same as
last time: :mod:`.recipes` turns each request a callback yielded into a
JSON-ready recipe (or says why it cannot), and a recipe back into a request
for the spider; :mod:`.replay` builds the stand-in response whose callback
yields them again when the page answers 304 or is not due.
"""

from __future__ import annotations
