"""Project commands: ``scrapy demo``, ``scrapy items``, and ``scrapy crawl``
(Scrapy's, with a non-zero exit status when a crawl could not go on)."""
