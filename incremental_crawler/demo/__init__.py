"""What ``scrapy demo`` crawls: a small site of its own, served on loopback."""

from incremental_crawler.demo.site import DemoSite, Hit

__all__ = ["DemoSite", "Hit"]
