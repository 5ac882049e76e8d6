"""Project commands: ``scrapy demo``, ``scrapy items``, ``scrapy state``,
``scrapy report``, and ``scrapy crawl`` (Scrapy's, with a non-zero exit
status when a crawl could not go on); ``shell``, ``fetch``, ``view``,
``parse`` and ``check`` are Scrapy's with nothing incremental."""
