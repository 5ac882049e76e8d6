"""Project commands: ``scrapy demo``, ``scrapy items``, and ``scrapy crawl`` with a truthful exit status."""
