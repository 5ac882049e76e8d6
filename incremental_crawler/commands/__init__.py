"""Project commands: ``scrapy demo``, ``scrapy items``, ``scrapy state``,
``scrapy report``, and ``scrapy crawl`` (Scrapy's, with a non-zero exit
status when a crawl could not go on); ``shell``, ``fetch``, ``view``,
``parse`` and ``check`` are Scrapy's with nothing incremental.

Registered through the package's ``scrapy.commands`` entry points (pyproject.toml):
installing the package is enough. Those that replace Scrapy's are Scrapy's
own wherever the add-on is not enabled
(:func:`~incremental_crawler.addon.addon_enabled`). ``COMMANDS_MODULE =
"incremental_crawler.commands"`` registers the same classes.
"""
