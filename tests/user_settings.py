"""Settings of a user's own Scrapy project with the add-on line and nothing
else of ours (no ``COMMANDS_MODULE``): ``SCRAPY_SETTINGS_MODULE=tests.user_settings``."""

BOT_NAME = "user_project"
ADDONS = {"incremental_crawler.addon.IncrementalAddon": 0}
ROBOTSTXT_OBEY = True
