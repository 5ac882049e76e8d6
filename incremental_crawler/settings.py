"""Settings of the incremental_crawler project.

Everything incremental is wired by the add-on; see docs/reference/settings.md for the
``INCREMENTAL_*`` settings and their defaults.
"""

BOT_NAME = "incremental_crawler"

SPIDER_MODULES = ["incremental_crawler.spiders"]
NEWSPIDER_MODULE = "incremental_crawler.spiders"
COMMANDS_MODULE = "incremental_crawler.commands"

ADDONS = {"incremental_crawler.addon.IncrementalAddon": 0}

ROBOTSTXT_OBEY = True
USER_AGENT = "incremental_crawler/0.1"

CONCURRENT_REQUESTS_PER_DOMAIN = 8
FEED_EXPORT_ENCODING = "utf-8"
