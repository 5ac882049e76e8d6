"""Project commands: ``scrapy demo`` and ``scrapy items``."""
